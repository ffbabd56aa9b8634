//! Tables for people, JSON for scripts.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::LockState;
use serde_json::{Value, json};
use unicode_width::UnicodeWidthStr;

/// The lease left, for people.
pub(crate) fn lease(state: &LockState) -> String {
    match (state.held, state.remaining) {
        (false, _) => "-".into(),
        (true, None) => "no expiry".into(),
        (true, Some(left)) => humantime::format_duration(Duration::from_millis(
            u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
        ))
        .to_string(),
    }
}

/// The queue, for people: `-`, or the labels in line order.
pub(crate) fn waiting(state: &LockState) -> String {
    if state.waiting.is_empty() {
        "-".into()
    } else {
        visible(&state.waiting.join(", ")).into_owned()
    }
}

/// When the holder took it, for people: the time, and how long ago.
fn since(state: &LockState) -> String {
    let Some(since) = state.since else {
        return "-".into();
    };
    let ago = SystemTime::now().duration_since(since).unwrap_or_default();
    format!(
        "{} ({} ago)",
        humantime::format_rfc3339_seconds(since),
        humantime::format_duration(Duration::from_secs(ago.as_secs()))
    )
}

fn to_json(s: &LockState) -> Value {
    json!({
        "key": s.key,
        "kind": s.kind.as_str(),
        "held": s.held,
        "holder": s.holder,
        "holders": s.holders,
        "since_ms": s.since.and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_millis() as u64),
        "remaining_ms": s.remaining.map(|d| d.as_millis() as u64),
        "fencing_counter": s.fencing_counter,
        "waiters": s.waiters,
        "waiting": s.waiting,
    })
}

/// `show KEY`: one lock, field by field.
pub(crate) fn show(s: &LockState, as_json: bool) {
    if as_json {
        println!("{}", to_json(s));
        return;
    }
    let holders = if s.holders.len() > 1 {
        s.holders.join(", ")
    } else {
        s.holder.clone().unwrap_or_else(|| "-".into())
    };
    let holders = visible(&holders).into_owned();
    let rows = [
        ("KEY", visible(&s.key).into_owned()),
        ("KIND", s.kind.as_str().to_owned()),
        ("HELD", if s.held { "yes" } else { "no" }.to_owned()),
        (
            if s.holders.len() > 1 {
                "HOLDERS"
            } else {
                "HOLDER"
            },
            holders,
        ),
        ("SINCE", since(s)),
        ("LEASE LEFT", lease(s)),
        ("FENCING COUNTER", s.fencing_counter.to_string()),
        (
            "WAITING",
            format!(
                "{} {}",
                s.waiters,
                if s.waiters == 0 {
                    String::new()
                } else {
                    format!("({})", waiting(s))
                }
            )
            .trim_end()
            .to_owned(),
        ),
    ];
    for (name, value) in rows {
        println!("{name:<16} {value}");
    }
}

/// `list`: one lock a line.
pub(crate) fn list(states: &[LockState], as_json: bool) {
    if as_json {
        println!("{}", Value::Array(states.iter().map(to_json).collect()));
        return;
    }
    let holder = |s: &LockState| s.holders.join(", ");
    let key_w = widest(states.iter().map(|s| s.key.as_str()), "KEY");
    let holders: Vec<String> = states.iter().map(holder).collect();
    let holder_w = widest(holders.iter().map(String::as_str), "HOLDER");
    println!(
        "{}  {:9}  {}  {:>12}  {:>15}  WAITING",
        padded("KEY", key_w),
        "KIND",
        padded("HOLDER", holder_w),
        "LEASE LEFT",
        "FENCING COUNTER"
    );
    for s in states {
        println!(
            "{}  {:9}  {}  {:>12}  {:>15}  {}",
            padded(&s.key, key_w),
            s.kind.as_str(),
            padded(&holder(s), holder_w),
            lease(s),
            s.fencing_counter,
            waiting(s)
        );
    }
}

/// The columns of a terminal the widest of `texts` and `header` takes (as
/// [`visible`] shows them).
pub(crate) fn widest<'a>(texts: impl Iterator<Item = &'a str>, header: &str) -> usize {
    let widths = texts.map(|text| visible(text).width());
    widths.max().unwrap_or(0).max(header.width())
}

/// `text` ([`visible`]) padded with spaces to `columns` of a terminal: as
/// wide as it shows (a Cyrillic letter one column, an emoji or a CJK
/// character two), not as long as its bytes or characters.
pub(crate) fn padded(text: &str, columns: usize) -> String {
    let text = visible(text);
    let pad = columns.saturating_sub(text.width());
    format!("{text}{}", " ".repeat(pad))
}

/// `text` as a terminal can show it without being fooled: control
/// characters (a carriage return, an escape sequence that erases the line
/// or sets the window's title: a label is any text a client wrote) and the
/// characters that show nothing or reorder what follows them (bidirectional
/// overrides and isolates, zero-width ones) written out as `\u{1b}`, so a
/// key or a label cannot pass for another, nor turn the columns after it
/// around. JSON keeps them as they are (escaped as JSON escapes them).
pub(crate) fn visible(text: &str) -> Cow<'_, str> {
    fn hidden(c: char) -> bool {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
    }
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hidden(c) {
            shown.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            shown.push(c);
        }
    }
    Cow::Owned(shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_that_hide_or_reorder_are_written_out() {
        assert_eq!(visible("order:1"), "order:1");
        assert_eq!(visible("pod-\u{202e}a-dop"), "pod-\\u{202e}a-dop");
        assert_eq!(visible("a\u{200b}b\u{2066}"), "a\\u{200b}b\\u{2066}");
        assert_eq!(padded("x\u{202e}", 12), "x\\u{202e}   ");
        assert_eq!(widest(["x\u{202e}"].into_iter(), "KEY"), 9);
    }

    #[test]
    fn control_characters_are_written_out() {
        // A label that would erase its own line and set the window's title.
        let label = "evil-pod\r\x1b[2Kpod-a\x1b]0;pwned\x07";
        assert_eq!(
            visible(label),
            "evil-pod\\u{d}\\u{1b}[2Kpod-a\\u{1b}]0;pwned\\u{7}"
        );
        assert_eq!(visible("a\tb\n"), "a\\u{9}b\\u{a}");
    }
}
