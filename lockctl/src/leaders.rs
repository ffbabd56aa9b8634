//! `lockctl leaders`: the elected leaders (`LockClient::leader`), with the
//! label each leader campaigned under and its term (its fencing token).

use lock_runtime::{Leader, LockClient, LockError};
use serde_json::json;

/// Prints up to `limit` leaders whose names start with `prefix`, as a
/// table or (`as_json`) a JSON array of `{name, label, term}`.
pub(crate) async fn print(
    client: &LockClient,
    prefix: &str,
    limit: usize,
    as_json: bool,
) -> Result<(), LockError> {
    let leaders = client.leaders(prefix, limit).await?;
    if as_json {
        let rows: Vec<_> = leaders
            .iter()
            .map(|l| json!({ "name": l.name, "label": l.label, "term": l.term }))
            .collect();
        println!("{}", serde_json::Value::Array(rows));
    } else {
        print!("{}", table(&leaders));
    }
    Ok(())
}

fn table(leaders: &[Leader]) -> String {
    let name = leaders
        .iter()
        .map(|l| l.name.len())
        .max()
        .unwrap_or(0)
        .max(4);
    let label = leaders
        .iter()
        .map(|l| l.label.len())
        .max()
        .unwrap_or(0)
        .max(5);
    let mut out = format!("{:name$}  {:label$}  {:>6}\n", "NAME", "LABEL", "TERM");
    for l in leaders {
        out += &format!("{:name$}  {:label$}  {:>6}\n", l.name, l.label, l.term);
    }
    out
}
