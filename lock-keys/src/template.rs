//! Key templates: `"order:<order_id>"`, `"{tenant:<self.tenant>}:<order.id>"`.
//!
//! The grammar, for the attribute and `LockLayer::key` alike:
//!
//! * `<path>` is a placeholder. `path` is a Rust identifier (ASCII, not `_`
//!   alone), optionally followed by `.field` steps, each an identifier or a
//!   tuple index written without leading zeros (`<order.id>`, `<pair.0>`).
//!   `LockLayer` accepts only the first form, a path parameter's name.
//! * `<<` and `>>` write a literal `<` and `>`.
//! * Everything else is literal text, braces included: they are Redis Cluster
//!   hash tags, which is why placeholders are not written `{...}`.
//! * A template is not empty, contains no control characters, and its literal
//!   text alone fits in [`MAX_KEY_LEN`] bytes (a longer one could never render
//!   a valid key).
//!
//! The messages of [`TemplateError`] are the attribute's compile errors; the
//! trybuild tests of `lock-macros` hold them.

use std::fmt;

use crate::MAX_KEY_LEN;

/// One piece of a parsed template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// Literal text, escapes resolved.
    Text(String),
    /// A `<...>` placeholder.
    Placeholder(Placeholder),
}

/// `<root.a.b>`: a name (a parameter, `self`, or a path parameter) and the
/// fields under it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placeholder {
    /// The name before the first `.`.
    pub root: String,
    /// Field names or tuple indices after it, outermost first; empty for a
    /// simple `<name>`.
    pub fields: Vec<String>,
}

impl Placeholder {
    /// `true` for `<name>`, without fields.
    pub fn is_simple(&self) -> bool {
        self.fields.is_empty()
    }
}

/// Written as in the template: `<root.a.b>`.
impl fmt::Display for Placeholder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{}", self.root)?;
        for field in &self.fields {
            write!(f, ".{field}")?;
        }
        f.write_str(">")
    }
}

/// Why a template was refused. `Display` says what to write instead.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TemplateError {
    /// The template is the empty string.
    Empty,
    /// The template contains this control character.
    ControlCharacter(char),
    /// The literal text alone is this many bytes, over [`MAX_KEY_LEN`].
    TooLong(usize),
    /// A `<` with no `>` before the next `<` or the end.
    Unclosed,
    /// A `>` that closes nothing and is not doubled.
    UnmatchedClose,
    /// A `<...>` whose content (given) is not a name or a field path.
    InvalidPlaceholder(String),
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => {
                f.write_str("the key template is empty; name the lock, as in \"order:<order_id>\"")
            }
            Self::ControlCharacter(c) => write!(
                f,
                "the key template contains the control character {c:?}; keys cannot contain \
                 control characters"
            ),
            Self::TooLong(len) => write!(
                f,
                "the literal text of the key template is {len} bytes long; keys are limited \
                 to {MAX_KEY_LEN} bytes"
            ),
            Self::Unclosed => f.write_str(
                "unclosed `<` in the key template; close the placeholder with `>`, or write \
                 `<<` for a literal `<`",
            ),
            Self::UnmatchedClose => {
                f.write_str("unmatched `>` in the key template; write `>>` for a literal `>`")
            }
            Self::InvalidPlaceholder(inner) => write!(
                f,
                "invalid placeholder `<{inner}>` in the key template; expected a parameter \
                 or a field path on one, as in `<order_id>`, `<order.id>` or `<self.tenant>`"
            ),
        }
    }
}

impl std::error::Error for TemplateError {}

/// Splits a template into text and placeholders, or says what is wrong.
/// Adjacent text is merged: placeholders and text alternate.
pub fn parse(template: &str) -> Result<Vec<Segment>, TemplateError> {
    if template.is_empty() {
        return Err(TemplateError::Empty);
    }
    if let Some(c) = template.chars().find(|c| c.is_control()) {
        return Err(TemplateError::ControlCharacter(c));
    }
    let mut segments = Vec::new();
    let mut text = String::new();
    let mut text_len = 0;
    let mut rest = template;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("<<") || rest.starts_with(">>") {
            text.push(c);
            rest = &rest[2..];
        } else if c == '>' {
            return Err(TemplateError::UnmatchedClose);
        } else if c == '<' {
            // The placeholder ends at the next `>`; a `<` before it means the
            // first one was never closed.
            let body = &rest[1..];
            let end = body
                .find(['<', '>'])
                .filter(|&i| body[i..].starts_with('>'))
                .ok_or(TemplateError::Unclosed)?;
            let placeholder = placeholder(&body[..end])?;
            if !text.is_empty() {
                text_len += text.len();
                segments.push(Segment::Text(std::mem::take(&mut text)));
            }
            segments.push(Segment::Placeholder(placeholder));
            rest = &body[end + 1..];
        } else {
            text.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    if !text.is_empty() {
        text_len += text.len();
        segments.push(Segment::Text(text));
    }
    if text_len > MAX_KEY_LEN {
        return Err(TemplateError::TooLong(text_len));
    }
    Ok(segments)
}

/// `root.a.0.b` -> `root`, [`a`, `0`, `b`].
fn placeholder(inner: &str) -> Result<Placeholder, TemplateError> {
    let invalid = || TemplateError::InvalidPlaceholder(inner.to_owned());
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
    Ok(Placeholder {
        root: root.to_owned(),
        fields,
    })
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
        Segment::Placeholder(Placeholder {
            root: root.into(),
            fields: fields.iter().map(|f| f.to_string()).collect(),
        })
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
        assert_eq!(
            parse("{t:<tenant>}:<id>").unwrap(),
            vec![text("{t:"), ph("tenant", &[]), text("}:"), ph("id", &[])]
        );
    }

    #[test]
    fn doubled_angle_brackets_are_literal() {
        assert_eq!(
            parse("a<<b>>c<x>").unwrap(),
            vec![text("a<b>c"), ph("x", &[])]
        );
        assert_eq!(parse("<<<x>").unwrap(), vec![text("<"), ph("x", &[])]);
        assert_eq!(parse("<x>>>").unwrap(), vec![ph("x", &[]), text(">")]);
    }

    #[test]
    fn non_ascii_text_is_kept() {
        assert_eq!(
            parse("commande:é<id>ü").unwrap(),
            vec![text("commande:é"), ph("id", &[]), text("ü")]
        );
    }

    #[test]
    fn placeholders_display_as_written() {
        let [Segment::Placeholder(p)] = &parse("<a.b.0>").unwrap()[..] else {
            panic!("one placeholder");
        };
        assert_eq!(p.to_string(), "<a.b.0>");
        assert!(!p.is_simple());
        let [Segment::Placeholder(p)] = &parse("<id>").unwrap()[..] else {
            panic!("one placeholder");
        };
        assert!(p.is_simple());
    }

    #[test]
    fn malformed_templates_are_refused() {
        for bad in [
            "", "<", "a<b", "a>b", "<>", "< a >", "<a.>", "<.a>", "<a..b>", "<1a>", "<a.01>",
            "<a-b>", "<_>", "<a<b>", "<é>", "<a/b>", "a\nb", "tab\t<x>",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn each_mistake_has_its_own_error() {
        assert_eq!(parse(""), Err(TemplateError::Empty));
        assert_eq!(parse("a\nb"), Err(TemplateError::ControlCharacter('\n')));
        assert_eq!(parse("order:<id"), Err(TemplateError::Unclosed));
        assert_eq!(parse("<a<b>"), Err(TemplateError::Unclosed));
        assert_eq!(parse("a>b"), Err(TemplateError::UnmatchedClose));
        assert_eq!(
            parse("order:< id >"),
            Err(TemplateError::InvalidPlaceholder(" id ".into()))
        );
        // The wording is the attribute's compile error (lock-macros/ui/fail).
        assert_eq!(
            TemplateError::Unclosed.to_string(),
            "unclosed `<` in the key template; close the placeholder with `>`, or write `<<` \
             for a literal `<`"
        );
    }

    #[test]
    fn only_the_literal_text_counts_against_the_key_length_limit() {
        let fits = "k".repeat(MAX_KEY_LEN);
        assert!(parse(&fits).is_ok());
        assert!(parse(&format!("{fits}<a_long_parameter_name>")).is_ok());
        // `<<` is one byte of text.
        assert!(parse(&"<<".repeat(MAX_KEY_LEN)).is_ok());
        assert_eq!(
            parse(&format!("{fits}<x>k")),
            Err(TemplateError::TooLong(MAX_KEY_LEN + 1))
        );
        assert_eq!(
            parse(&"é".repeat(MAX_KEY_LEN / 2 + 1)),
            Err(TemplateError::TooLong(MAX_KEY_LEN + 2))
        );
    }
}
