//! The model is tied to the scripts: a script that changes without the model
//! fails here.

use std::path::Path;

#[test]
fn every_script_is_mirrored_by_the_model_as_it_is_today() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../lock-runtime/scripts");
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("lock-runtime/scripts") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|e| e != "lua") {
            continue;
        }
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read(&path).expect("a script");
        let sha = sha1_smol::Sha1::from(&text).digest().to_string();
        match model::scripts::MIRRORED.iter().find(|(f, ..)| *f == file) {
            None => problems.push(format!(
                "{file} is new: model it (or say in model/src/scripts.rs why it needs no model), \
                 then add it to MIRRORED with SHA-1 {sha}"
            )),
            Some((_, expected, at)) if *expected != sha => problems.push(format!(
                "{file} changed: update the model transitions that cite it ({at}), \
                 then its SHA-1 in model/src/scripts.rs to {sha}"
            )),
            Some(_) => {}
        }
        seen.push(file);
    }
    for (file, _, _) in model::scripts::MIRRORED {
        if !seen.iter().any(|s| s == file) {
            problems.push(format!(
                "{file} is gone: remove it and its model from model/src"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
