//! Key templates: `"order:<order_id>"`, `"{tenant:<self.tenant>}:<order.id>"`.
//!
//! `<path>` is a placeholder; everything else is literal, braces included (they
//! are Redis Cluster hash tags). `<<` and `>>` write a literal `<` and `>`.

/// One piece of a template.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Literal text, escapes resolved.
    Text(String),
    /// `<root.a.b>`: a parameter (or `self`) and the fields under it.
    Placeholder {
        /// The parameter, or `self`.
        root: String,
        /// Field names or tuple indices, outermost first.
        fields: Vec<String>,
    },
}

/// Mirrors `lock_runtime::MAX_KEY_LEN`: the text alone must fit.
const MAX_KEY_LEN: usize = 1024;

/// Splits a template into text and placeholders, or says what is wrong.
pub(crate) fn parse(template: &str) -> Result<Vec<Segment>, String> {
    if template.is_empty() {
        return Err("the key template is empty; name the lock, as in \"order:<order_id>\"".into());
    }
    if let Some(c) = template.chars().find(|c| c.is_control()) {
        return Err(format!(
            "the key template contains the control character {c:?}; keys cannot contain \
             control characters"
        ));
    }
    if template.len() > MAX_KEY_LEN {
        return Err(format!(
            "the key template is {} bytes long; keys are limited to {MAX_KEY_LEN} bytes",
            template.len()
        ));
    }
    let mut segments = Vec::new();
    let mut text = String::new();
    let mut chars = template.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        match c {
            '<' if chars.peek().is_some_and(|&(_, c)| c == '<') => {
                chars.next();
                text.push('<');
            }
            '>' if chars.peek().is_some_and(|&(_, c)| c == '>') => {
                chars.next();
                text.push('>');
            }
            '>' => {
                return Err(
                    "unmatched `>` in the key template; write `>>` for a literal `>`".into(),
                );
            }
            '<' => {
                let rest = &template[start + 1..];
                let Some(len) = rest
                    .find(['>', '<'])
                    .filter(|&i| rest[i..].starts_with('>'))
                else {
                    return Err("unclosed `<` in the key template; close the placeholder \
                                with `>`, or write `<<` for a literal `<`"
                        .into());
                };
                let inner = &rest[..len];
                let (root, fields) = placeholder(inner)?;
                if !text.is_empty() {
                    segments.push(Segment::Text(std::mem::take(&mut text)));
                }
                segments.push(Segment::Placeholder { root, fields });
                // Skip the placeholder and its `>`.
                for _ in 0..inner.chars().count() + 1 {
                    chars.next();
                }
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        segments.push(Segment::Text(text));
    }
    Ok(segments)
}

/// `root.a.0.b` -> (`root`, [`a`, `0`, `b`]).
fn placeholder(inner: &str) -> Result<(String, Vec<String>), String> {
    let invalid = || {
        format!(
            "invalid placeholder `<{inner}>` in the key template; expected a parameter \
             or a field path on one, as in `<order_id>`, `<order.id>` or `<self.tenant>`"
        )
    };
    let mut parts = inner.split('.');
    let root = parts.next().unwrap_or_default();
    if !is_ident(root) {
        return Err(invalid());
    }
    let mut fields = Vec::new();
    for part in parts {
        let index = !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
        let canonical_index = index && (part == "0" || !part.starts_with('0'));
        if !(is_ident(part) || canonical_index) {
            return Err(invalid());
        }
        fields.push(part.to_owned());
    }
    Ok((root.to_owned(), fields))
}

/// A Rust identifier as written in a template (ASCII; `_` alone is not a name).
fn is_ident(s: &str) -> bool {
    let mut bytes = s.bytes();
    match bytes.next() {
        Some(b) if b == b'_' || b.is_ascii_alphabetic() => {}
        _ => return false,
    }
    s != "_" && bytes.all(|b| b == b'_' || b.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Segment {
        Segment::Text(s.into())
    }

    fn ph(root: &str, fields: &[&str]) -> Segment {
        Segment::Placeholder {
            root: root.into(),
            fields: fields.iter().map(|f| f.to_string()).collect(),
        }
    }

    #[test]
    fn placeholders_split_the_template() {
        assert_eq!(
            parse("order:<order_id>").unwrap(),
            vec![text("order:"), ph("order_id", &[])]
        );
        assert_eq!(
            parse("<a><b.c.0>:x").unwrap(),
            vec![ph("a", &[]), ph("b", &["c", "0"]), text(":x")]
        );
        assert_eq!(parse("plain").unwrap(), vec![text("plain")]);
    }

    #[test]
    fn braces_are_literal_for_hash_tags() {
        assert_eq!(
            parse("{tenant:<self.tenant>}:order:<order.id>").unwrap(),
            vec![
                text("{tenant:"),
                ph("self", &["tenant"]),
                text("}:order:"),
                ph("order", &["id"]),
            ]
        );
    }

    #[test]
    fn doubled_angle_brackets_are_literal() {
        assert_eq!(
            parse("a<<b>>c<x>").unwrap(),
            vec![text("a<b>c"), ph("x", &[])]
        );
        assert_eq!(parse("<<<x>").unwrap(), vec![text("<"), ph("x", &[])]);
    }

    #[test]
    fn non_ascii_text_is_kept() {
        assert_eq!(
            parse("commande:é<id>ü").unwrap(),
            vec![text("commande:é"), ph("id", &[]), text("ü")]
        );
    }

    #[test]
    fn malformed_templates_are_refused() {
        for bad in [
            "", "<", "a<b", "a>b", "<>", "< a >", "<a.>", "<.a>", "<a..b>", "<1a>", "<a.01>",
            "<a-b>", "<_>", "<a<b>", "<é>", "a\nb", "tab\t<x>",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
