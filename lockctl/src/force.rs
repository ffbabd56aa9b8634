//! `lockctl force-release`: ask, release, raise the fence, say who did it.

use std::io::{BufRead, Write};

use lock_runtime::{LockClient, LockState};
use serde_json::json;

use crate::Failure;
use crate::output::{lease, visible, waiting};

pub(crate) async fn release(
    client: &LockClient,
    key: &str,
    yes: bool,
    as_json: bool,
) -> Result<(), Failure> {
    let state = client.inspect(key).await?;
    if !state.held {
        return Err(Failure(format!("`{key}` is not held: nothing to release")));
    }
    if !yes && !confirm(&state)? {
        return Err(Failure("not released".into()));
    }
    // The answer was for the holder shown: one that took the key meanwhile
    // (the one shown released it, a waiter was handed it) is not released.
    let now = client.inspect(key).await?;
    if !same_hold(&state, &now) {
        let holders = if now.held {
            format!("now held by {}", visible(&now.holders.join(", ")))
        } else {
            "now free".into()
        };
        return Err(Failure(format!(
            "`{}` changed hands while you answered ({holders}); nothing was released: run \
             the command again to see who holds it",
            visible(key)
        )));
    }
    let who = operator();
    let held = client.force_release(key).await?;
    let after = client.inspect(key).await?;
    let holder = visible(state.holder.as_deref().unwrap_or("-")).into_owned();
    let shown_key = visible(key);
    let what = if held {
        "force-released"
    } else {
        "found free (nothing released)"
    };
    eprintln!(
        "lockctl: {who} {what} `{shown_key}` (held by {holder}; fencing counter now {})",
        after.fencing_counter
    );
    if as_json {
        println!(
            "{}",
            json!({
                "key": key,
                "released": held,
                "by": who,
                "holder": state.holder,
                "holders": state.holders,
                "fencing_counter": after.fencing_counter,
            })
        );
    } else {
        println!(
            "released `{shown_key}` (held by {holder}); fencing counter now {}: fenced writes \
             with an earlier token are refused",
            after.fencing_counter
        );
    }
    Ok(())
}

/// `user@host` of whoever runs this, for the log.
pub(crate) fn operator() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown-host".into());
    named(&user, &host)
}

/// `user@host`, without control characters, in at most 100 bytes (a label
/// has at most 128, with `lockctl:` before), cut between characters.
fn named(user: &str, host: &str) -> String {
    let mut who = String::new();
    for c in format!("{user}@{host}").chars().filter(|c| !c.is_control()) {
        if who.len() + c.len_utf8() > 100 {
            break;
        }
        who.push(c);
    }
    who
}

/// Whether `now` is the hold `seen` showed: the same kind, holders and start
/// (each holder's token carries when it was drawn, to the millisecond).
fn same_hold(seen: &LockState, now: &LockState) -> bool {
    now.held && (now.kind, &now.holders, now.since) == (seen.kind, &seen.holders, seen.since)
}

fn confirm(state: &LockState) -> Result<bool, Failure> {
    eprint!(
        "force-release `{}` ({} held by {}, lease left {}, waiting: {})? The holder may still \
         be working; its fenced writes will be refused. [y/N] ",
        visible(&state.key),
        state.kind.as_str(),
        visible(&state.holders.join(", ")),
        lease(state),
        waiting(state),
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure(format!("cannot read the answer: {e}")))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

#[cfg(test)]
mod tests {
    use super::named;

    #[test]
    fn an_operator_is_named_in_at_most_100_bytes_whatever_the_letters() {
        assert_eq!(named("ann", "ops-1"), "ann@ops-1");
        let long = named(&"é".repeat(70), "host");
        assert_eq!(long.len(), 100);
        assert!(long.chars().all(|c| c == 'é'));
        assert_eq!(named("a\u{1b}]0;x\u{7}", "h"), "a]0;x@h");
    }
}
