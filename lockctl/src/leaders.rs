//! `lockctl leaders`: the elected leaders (`LockClient::leader`), with the
//! label each leader campaigned under and its term (its fencing token).

use lock_runtime::{Leader, LockClient, LockError};
use serde_json::json;

use crate::output::{padded, widest};

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
    let name = widest(leaders.iter().map(|l| l.name.as_str()), "NAME");
    let label = widest(leaders.iter().map(|l| l.label.as_str()), "LABEL");
    let row = |n: &str, l: &str, term: &dyn std::fmt::Display| {
        format!("{}  {}  {term:>6}\n", padded(n, name), padded(l, label))
    };
    let mut out = row("NAME", "LABEL", &"TERM");
    for l in leaders {
        out += &row(&l.name, &l.label, &l.term);
    }
    out
}
