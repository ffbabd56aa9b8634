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

/// The model cites a script's step by anchor: the script's file and a quoted
/// fragment of the step's comment or command, `<file>.lua, "<fragment>"`,
/// which occurs exactly once in that script. Line numbers go stale as soon
/// as a line is added above them; an anchor is found again by `grep -F`,
/// and this test fails when a script's change leaves an anchor behind.
#[test]
fn scripts_are_cited_by_anchor_never_by_line_number() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scripts = root.join("../lock-runtime/scripts");
    let mut files = Vec::new();
    model_files(root, &mut files);
    assert!(files.len() > 10, "found only {files:?} under {root:?}");
    let mut problems = Vec::new();
    for path in &files {
        let source = std::fs::read_to_string(path).expect("a model file");
        let shown = path.strip_prefix(root).unwrap_or(path).display();
        let flat = Flat::new(&source);
        let mut lines: Vec<usize> = line_citations(&flat.text)
            .into_iter()
            .map(|at| flat.line_of(at))
            .collect();
        lines.dedup();
        for line in lines {
            problems.push(format!(
                "{shown}:{line}: cites a script by line number; cite an anchor instead"
            ));
        }
        for anchor in anchors(&flat.text) {
            let line = flat.line_of(anchor.start);
            let (file, fragment) = (anchor.file, anchor.fragment);
            if line != flat.line_of(anchor.at + fragment.len()) {
                problems.push(format!(
                    "{shown}:{line}: {file}, \"{fragment}\" is split across lines; keep \
                     the anchor on one line, so that grep finds it here too"
                ));
                continue;
            }
            let Ok(script) = std::fs::read_to_string(scripts.join(file)) else {
                problems.push(format!(
                    "{shown}:{line}: no script {file} in lock-runtime/scripts"
                ));
                continue;
            };
            match script.matches(fragment).count() {
                1 => {}
                0 => problems.push(format!(
                    "{shown}:{line}: \"{fragment}\" is not in {file} (any more); \
                     cite the step's comment or command as it reads today"
                )),
                n => problems.push(format!(
                    "{shown}:{line}: \"{fragment}\" occurs {n} times in {file}; \
                     quote more of the step so that it names one place"
                )),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The checks above see what they must (the citations are built here, so that
/// this file itself cites no script by line).
#[test]
fn the_citation_checks_see_line_numbers_and_anchors() {
    for cited in [
        concat!("as idempotency_claim", ".lua:", "37-41 does"),
        concat!("shared", ".lua `acquire` (", "141-183)"),
        concat!("lines ", "3-5 of release", ".lua"),
        concat!("mint", ".lua, line ", "12"),
        concat!("reserve", ".lua\n/// (", "40)"),
    ] {
        assert_eq!(line_citations(&Flat::new(cited).text).len(), 1, "{cited}");
    }
    for fine in [
        "mint.lua: minted fencing 2 (fencing 1, lease 2)",
        "acquire.lua's free path gives a key with a line behind it",
        "shared.lua's `acquire`, line by line",
    ] {
        assert!(line_citations(&Flat::new(fine).text).is_empty(), "{fine}");
    }
    let flat = Flat::new("// as release.lua,\n// \"-- Our own\" does; acquire.lua (no anchor)");
    let found = anchors(&flat.text);
    assert_eq!(found.len(), 1);
    assert_eq!(
        (found[0].file, found[0].fragment),
        ("release.lua", "-- Our own")
    );
    assert_eq!(flat.line_of(found[0].start), 1);
    assert_eq!(flat.line_of(found[0].at), 2);
}

/// The model's sources, tests and documents under `dir`.
fn model_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a model directory") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                model_files(&path, out);
            }
        } else if ["rs", "md", "toml"]
            .iter()
            .any(|e| path.extension().is_some_and(|x| x == *e))
        {
            out.push(path);
        }
    }
}

/// A file's text with each line's indentation and comment marker (`//!`,
/// `///`, `//`) taken out and its lines joined by single spaces, so that a
/// citation wrapped in a comment reads as one.
struct Flat {
    text: String,
    /// Where each line of the file starts in `text`.
    starts: Vec<usize>,
}

impl Flat {
    fn new(source: &str) -> Self {
        let mut text = String::new();
        let mut starts = Vec::new();
        for line in source.lines() {
            let line = line.trim_start();
            let line = ["//!", "///", "//"]
                .iter()
                .find_map(|m| line.strip_prefix(m))
                .unwrap_or(line)
                .trim();
            if !text.is_empty() {
                text.push(' ');
            }
            starts.push(text.len());
            text.push_str(line);
        }
        Flat { text, starts }
    }

    /// The line (from 1) of the file that `at` in `text` comes from.
    fn line_of(&self, at: usize) -> usize {
        self.starts.partition_point(|&s| s <= at)
    }
}

/// Where `text` names a script (the offset of each `.lua` preceded by a
/// file name).
fn script_names(text: &str) -> impl Iterator<Item = usize> + '_ {
    let bytes = text.as_bytes();
    text.match_indices(".lua")
        .map(|(at, _)| at)
        .filter(move |&at| {
            at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_')
        })
}

/// The scripts `text` cites by line: a file name followed by `:` and a
/// digit, or with `line 12` / `lines 3-5` or a bare `(40)` / `(141-183)`
/// within 40 bytes after it, or `line(s) N` within 40 bytes before it.
fn line_citations(text: &str) -> Vec<usize> {
    let bytes = text.as_bytes();
    script_names(text)
        .filter(|&at| {
            let after = &bytes[at + 4..bytes.len().min(at + 44)];
            let before = &bytes[at.saturating_sub(40)..at];
            (after.first() == Some(&b':') && after.get(1).is_some_and(u8::is_ascii_digit))
                || names_a_line(after)
                || names_a_line(before)
                || (0..after.len()).any(|i| after[i] == b'(' && bare_number(&after[i + 1..]))
        })
        .collect()
}

/// `line 12` or `lines 3` somewhere in `s`.
fn names_a_line(s: &[u8]) -> bool {
    (0..s.len()).any(|i| {
        let rest = &s[i..];
        let rest = rest
            .strip_prefix(b"lines ")
            .or_else(|| rest.strip_prefix(b"line "));
        rest.is_some_and(|r| r.first().is_some_and(u8::is_ascii_digit))
    })
}

/// `s` starts with `40)` or `141-183)`.
fn bare_number(s: &[u8]) -> bool {
    let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
    digits > 0 && matches!(s.get(digits), Some(b')' | b'-'))
}

/// A quoted anchor, `<file>.lua, "<fragment>"`, in a [`Flat`] text: from
/// `start` (its file name's first byte), its fragment from `at`.
struct Anchor<'a> {
    start: usize,
    at: usize,
    file: &'a str,
    fragment: &'a str,
}

/// Every anchor in `text`.
fn anchors(text: &str) -> Vec<Anchor<'_>> {
    let bytes = text.as_bytes();
    script_names(text)
        .filter_map(|dot| {
            let rest = text[dot + 4..].strip_prefix(", \"")?;
            let at = dot + 7;
            let fragment = &rest[..rest.find('"')?];
            let start = bytes[..dot]
                .iter()
                .rposition(|b| !(b.is_ascii_alphanumeric() || *b == b'_'))
                .map_or(0, |i| i + 1);
            Some(Anchor {
                start,
                at,
                file: &text[start..dot + 4],
                fragment,
            })
        })
        .collect()
}
