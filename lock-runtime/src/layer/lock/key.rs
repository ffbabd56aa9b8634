//! Where a [`LockLayer`](super::LockLayer) takes a request's lock key from.

use std::fmt;
use std::sync::Arc;

use axum::extract::{FromRequestParts, RawPathParams};
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use http::HeaderName;
use http::request::Parts;

/// A closure that names the lock of a request; `None`: the request cannot be
/// served (400).
pub(crate) type KeyFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync + 'static>;

/// Runs an extractor on the request head and names the lock from its value;
/// `Err` is the extractor's rejection, answered as it is.
pub(crate) type KeyExtractor = Arc<
    dyn for<'a> Fn(&'a mut Parts) -> BoxFuture<'a, Result<String, Response>>
        + Send
        + Sync
        + 'static,
>;

#[derive(Clone)]
pub(crate) enum KeySource {
    /// The request path (the default).
    Path,
    /// A template over path parameters.
    Template(Vec<Segment>),
    /// A header's value.
    Header(HeaderName),
    /// A closure over the request.
    Fn(KeyFn),
    /// A closure over an extractor's value; `extractor` is its type name.
    Extract {
        extract: KeyExtractor,
        extractor: &'static str,
    },
    /// A configuration mistake, reported on every request (500).
    Invalid(String),
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::Path => f.write_str("Path"),
            KeySource::Template(t) => f.debug_tuple("Template").field(t).finish(),
            KeySource::Header(h) => f.debug_tuple("Header").field(h).finish(),
            KeySource::Fn(_) => f.write_str("Fn(..)"),
            KeySource::Extract { extractor, .. } => write!(f, "Extract({extractor})"),
            KeySource::Invalid(e) => f.debug_tuple("Invalid").field(e).finish(),
        }
    }
}

/// Why no key could be built for a request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// The request lacks what the key is made of (400).
    Request(String),
    /// The layer is misconfigured (500).
    Config(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Segment {
    Text(String),
    Param(String),
}

/// Parses `"order:<id>"`: `<name>` is a path parameter, `<<` and `>>` write a
/// literal `<` and `>` (the same syntax as `#[distributed_lock]` keys).
pub(crate) fn parse_template(template: &str) -> Result<Vec<Segment>, String> {
    if template.is_empty() {
        return Err("the key template is empty; name the lock, as in \"order:<id>\"".into());
    }
    let mut segments = Vec::new();
    let mut text = String::new();
    let mut rest = template;
    while let Some(c) = rest.chars().next() {
        match c {
            '<' if rest.starts_with("<<") => {
                text.push('<');
                rest = &rest[2..];
            }
            '>' if rest.starts_with(">>") => {
                text.push('>');
                rest = &rest[2..];
            }
            '<' => {
                let Some(end) = rest[1..]
                    .find(['<', '>'])
                    .filter(|&i| rest[1 + i..].starts_with('>'))
                else {
                    return Err(format!(
                        "unclosed `<` in the key template {template:?}; close the placeholder \
                         with `>`, or write `<<` for a literal `<`"
                    ));
                };
                let name = &rest[1..1 + end];
                if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c == '/') {
                    return Err(format!(
                        "invalid placeholder `<{name}>` in the key template {template:?}; \
                         expected a path parameter name, as in `<id>`"
                    ));
                }
                if !text.is_empty() {
                    segments.push(Segment::Text(std::mem::take(&mut text)));
                }
                segments.push(Segment::Param(name.to_owned()));
                rest = &rest[end + 2..];
            }
            '>' => {
                return Err(format!(
                    "unmatched `>` in the key template {template:?}; write `>>` for a literal `>`"
                ));
            }
            c => {
                text.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    if !text.is_empty() {
        segments.push(Segment::Text(text));
    }
    Ok(segments)
}

impl KeySource {
    /// A source that runs the extractor `E` and names the lock with `f`.
    pub(crate) fn extract<E, F>(f: F) -> Self
    where
        E: FromRequestParts<()> + Send + 'static,
        F: Fn(E) -> String + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        KeySource::Extract {
            extract: Arc::new(move |parts: &mut Parts| {
                let f = f.clone();
                Box::pin(async move {
                    match E::from_request_parts(parts, &()).await {
                        Ok(value) => Ok(f(value)),
                        Err(rejection) => Err(rejection.into_response()),
                    }
                })
            }),
            extractor: std::any::type_name::<E>(),
        }
    }

    /// The lock key of the request whose head is `parts`, for every source
    /// but [`KeySource::Extract`] (which is async: the service runs it).
    pub(crate) fn build(&self, parts: &mut Parts) -> Result<String, KeyError> {
        match self {
            KeySource::Path => Ok(parts.uri.path().to_owned()),
            KeySource::Template(segments) => {
                let needs_params = segments.iter().any(|s| matches!(s, Segment::Param(_)));
                let params = if needs_params {
                    // Resolves at once: the router stored the parameters in the
                    // request's extensions.
                    match RawPathParams::from_request_parts(parts, &()).now_or_never() {
                        Some(Ok(params)) => Some(params),
                        Some(Err(e)) => return Err(KeyError::Request(e.body_text())),
                        None => {
                            return Err(KeyError::Config(
                                "the path parameters were not ready".into(),
                            ));
                        }
                    }
                } else {
                    None
                };
                let mut key = String::new();
                for segment in segments {
                    match segment {
                        Segment::Text(t) => key.push_str(t),
                        Segment::Param(name) => {
                            let value = params
                                .as_ref()
                                .and_then(|p| p.iter().find(|(k, _)| k == name).map(|(_, v)| v));
                            match value {
                                // Escaped: a path value cannot spell a separator
                                // or a hash tag of another resource's key.
                                Some(v) => crate::key::push_escaped(&mut key, v),
                                None => {
                                    return Err(KeyError::Request(format!(
                                        "the route has no path parameter `{name}` for the lock key"
                                    )));
                                }
                            }
                        }
                    }
                }
                Ok(key)
            }
            KeySource::Header(name) => {
                match parts.headers.get_all(name).iter().collect::<Vec<_>>()[..] {
                    [value] => match value.to_str() {
                        Ok(v) if !v.trim().is_empty() => Ok(v.trim().to_owned()),
                        _ => Err(KeyError::Request(format!(
                            "the `{name}` header is empty or not visible ASCII"
                        ))),
                    },
                    [] => Err(KeyError::Request(format!(
                        "the `{name}` header is required (it names the resource to lock)"
                    ))),
                    _ => Err(KeyError::Request(format!(
                        "the `{name}` header appears more than once"
                    ))),
                }
            }
            KeySource::Fn(f) => f(parts).ok_or_else(|| {
                KeyError::Request("the request does not name a resource to lock".into())
            }),
            KeySource::Extract { extractor, .. } => Err(KeyError::Config(format!(
                "the key extractor `{extractor}` runs in the service, not in `build`"
            ))),
            KeySource::Invalid(e) => Err(KeyError::Config(e.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Segment {
        Segment::Text(s.into())
    }
    fn param(s: &str) -> Segment {
        Segment::Param(s.into())
    }

    #[test]
    fn templates_split_into_text_and_parameters() {
        assert_eq!(
            parse_template("order:<id>").unwrap(),
            vec![text("order:"), param("id")]
        );
        assert_eq!(
            parse_template("{t:<tenant>}:<id>").unwrap(),
            vec![text("{t:"), param("tenant"), text("}:"), param("id")]
        );
        assert_eq!(parse_template("a<<b>>c").unwrap(), vec![text("a<b>c")]);
        assert_eq!(
            parse_template("é<x>ü").unwrap(),
            vec![text("é"), param("x"), text("ü")]
        );
    }

    #[test]
    fn malformed_templates_are_refused_with_a_reason() {
        for bad in ["", "<", "a<b", "a>b", "<>", "< a >", "<a<b>", "<a/b>"] {
            assert!(parse_template(bad).is_err(), "{bad:?}");
        }
    }

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::builder().uri("/orders/7/pay");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn headers_and_paths_name_keys() {
        let h = KeySource::Header(HeaderName::from_static("x-account"));
        assert_eq!(
            h.build(&mut parts(&[("x-account", " acc-1 ")])).unwrap(),
            "acc-1"
        );
        assert!(matches!(
            h.build(&mut parts(&[])),
            Err(KeyError::Request(_))
        ));
        assert!(matches!(
            h.build(&mut parts(&[("x-account", "a"), ("x-account", "b")])),
            Err(KeyError::Request(_))
        ));
        assert_eq!(
            KeySource::Path.build(&mut parts(&[])).unwrap(),
            "/orders/7/pay"
        );
        // Outside a router there are no path parameters: a request error.
        let t = KeySource::Template(parse_template("order:<id>").unwrap());
        assert!(matches!(
            t.build(&mut parts(&[])),
            Err(KeyError::Request(_))
        ));
        let fixed = KeySource::Template(parse_template("global").unwrap());
        assert_eq!(fixed.build(&mut parts(&[])).unwrap(), "global");
    }

    /// A header parsed into a number, for the extractor tests.
    struct Account(u32);

    impl<S: Sync> FromRequestParts<S> for Account {
        type Rejection = (http::StatusCode, &'static str);

        async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
            let value = parts.headers.get("x-account").and_then(|v| v.to_str().ok());
            match value.and_then(|v| v.trim().parse().ok()) {
                Some(n) => Ok(Account(n)),
                None => Err((
                    http::StatusCode::UNPROCESSABLE_ENTITY,
                    "x-account: a number",
                )),
            }
        }
    }

    /// The key, or the rejection's status.
    fn run_extractor(source: &KeySource, p: &mut Parts) -> Result<String, http::StatusCode> {
        let KeySource::Extract { extract, .. } = source else {
            panic!("not an extractor source: {source:?}");
        };
        extract(p)
            .now_or_never()
            .expect("a header extractor is ready at once")
            .map_err(|rejection| rejection.status())
    }

    #[test]
    fn extractor_keys_name_the_parsed_value_and_pass_rejections_through() {
        let source = KeySource::extract(|Account(n): Account| format!("account:{n}"));
        assert!(format!("{source:?}").contains("Account"), "{source:?}");
        for spelling in ["7", "007", "+7", " 7 "] {
            assert_eq!(
                run_extractor(&source, &mut parts(&[("x-account", spelling)])).unwrap(),
                "account:7",
                "{spelling:?}"
            );
        }
        let rejection = run_extractor(&source, &mut parts(&[("x-account", "seven")])).unwrap_err();
        assert_eq!(rejection, http::StatusCode::UNPROCESSABLE_ENTITY);
        // `build` is for the synchronous sources; it refuses instead of panicking.
        assert!(matches!(
            source.build(&mut parts(&[])),
            Err(KeyError::Config(_))
        ));
    }
}
