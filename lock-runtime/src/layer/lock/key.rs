//! Where a [`LockLayer`](super::LockLayer) takes a request's lock key from.

use std::fmt;
use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath, RawPathParams};
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use http::HeaderName;
use http::request::Parts;
use lock_keys::template::{self, Segment, TemplateError};

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
    /// A header's value: with `scoped`, escaped and under the route's
    /// namespace ([`header_key`]); without, the whole key (trusted).
    Header { name: HeaderName, scoped: bool },
    /// A closure over the request.
    Fn(KeyFn),
    /// A closure over an extractor's value; `extractor` is its type name.
    Extract {
        extract: KeyExtractor,
        extractor: &'static str,
    },
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::Path => f.write_str("Path"),
            KeySource::Template(t) => f.debug_tuple("Template").field(t).finish(),
            KeySource::Header { name, scoped } => f
                .debug_struct("Header")
                .field("name", name)
                .field("scoped", scoped)
                .finish(),
            KeySource::Fn(_) => f.write_str("Fn(..)"),
            KeySource::Extract { extractor, .. } => write!(f, "Extract({extractor})"),
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

/// The namespace of keys taken from a request header: no template, path
/// or key a client writes with escaped values can spell one.
pub(crate) const HEADER_NAMESPACE: &str = "header:";

/// The key a header's `value` names on `route` (the matched route, `*`
/// when the layer runs outside one): `header:<route>:<name>:<value>`,
/// each part escaped as a path value is ([`escape_key_part`]), so the
/// value names only this route's keys, never a template's (`item:42`) nor
/// another route's.
///
/// [`escape_key_part`]: crate::escape_key_part
pub(crate) fn header_key(route: &str, name: &HeaderName, value: &str) -> String {
    let mut key = String::with_capacity(
        HEADER_NAMESPACE.len() + route.len() + name.as_str().len() + value.len() + 8,
    );
    key.push_str(HEADER_NAMESPACE);
    crate::key::push_escaped(&mut key, route);
    key.push(':');
    crate::key::push_escaped(&mut key, name.as_str());
    key.push(':');
    crate::key::push_escaped(&mut key, value);
    key
}

/// Parses `"order:<id>"` with the grammar of `#[distributed_lock]` keys
/// (`lock_keys::template`): `<name>` is a path parameter, `<<` and `>>` write
/// a literal `<` and `>`, braces are literal. A field path (`<order.id>`)
/// names a Rust value the layer does not have: a configuration error.
pub(crate) fn parse_template(template: &str) -> Result<Vec<Segment>, String> {
    let segments = template::parse(template).map_err(|e| match e {
        TemplateError::InvalidPlaceholder(inner) => format!(
            "invalid placeholder `<{inner}>` in the key template {template:?}; expected a \
             path parameter name, as in `<id>`"
        ),
        e => format!("{e} (the template is {template:?})"),
    })?;
    let field_path = segments.iter().find_map(|segment| match segment {
        Segment::Placeholder(p) if !p.is_simple() => Some(p),
        _ => None,
    });
    if let Some(p) = field_path {
        return Err(format!(
            "the placeholder `{p}` in the key template {template:?} is a field path; a \
             `LockLayer` template names path parameters only, as in `<{}>` (to build the \
             key from a parsed value, use `key_from`)",
            p.root
        ));
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
            // Decoded, as the router reads it: `/orders/%31%35/pay` names
            // the resource `/orders/15/pay` does (another spelling of one
            // path must not take another lock).
            KeySource::Path => percent_encoding::percent_decode_str(parts.uri.path())
                .decode_utf8()
                .map(std::borrow::Cow::into_owned)
                .map_err(|_| KeyError::Request("the path is not UTF-8 once decoded".into())),
            KeySource::Template(segments) => {
                let needs_params = segments
                    .iter()
                    .any(|s| matches!(s, Segment::Placeholder(_)));
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
                        // `parse_template` admits simple placeholders only.
                        Segment::Placeholder(p) => {
                            let name = &p.root;
                            let value = params
                                .as_ref()
                                .and_then(|p| p.iter().find(|(k, _)| k == name).map(|(_, v)| v));
                            match value {
                                // Escaped: a path value cannot spell a separator
                                // or a hash tag of another resource's key.
                                Some(v) => crate::key::push_escaped(&mut key, v),
                                // The server's mistake, not the client's.
                                None => {
                                    let route = parts
                                        .extensions
                                        .get::<MatchedPath>()
                                        .map_or("(unmatched)", MatchedPath::as_str);
                                    return Err(KeyError::Config(format!(
                                        "the key template names `<{name}>`, and the route \
                                         `{route}` has no path parameter `{name}`"
                                    )));
                                }
                            }
                        }
                    }
                }
                Ok(key)
            }
            KeySource::Header { name, scoped } => {
                match parts.headers.get_all(name).iter().collect::<Vec<_>>()[..] {
                    [value] => match value.to_str() {
                        Ok(v) if !v.trim().is_empty() && !*scoped => Ok(v.trim().to_owned()),
                        Ok(v) if !v.trim().is_empty() => {
                            let route = parts
                                .extensions
                                .get::<MatchedPath>()
                                .map_or("*", MatchedPath::as_str);
                            Ok(header_key(route, name, v.trim()))
                        }
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_name_path_parameters() {
        let [Segment::Text(t), Segment::Placeholder(p)] =
            &parse_template("order:<id>").unwrap()[..]
        else {
            panic!("text and a placeholder");
        };
        assert_eq!((t.as_str(), p.root.as_str()), ("order:", "id"));
    }

    #[test]
    fn malformed_templates_are_refused_with_the_template_in_the_reason() {
        // The grammar's own cases are `lock_keys::template`'s tests.
        let e = parse_template("order:<id").unwrap_err();
        assert!(
            e.contains("unclosed `<`") && e.contains("\"order:<id\""),
            "{e}"
        );
        let e = parse_template("<a-b>").unwrap_err();
        assert!(e.contains("expected a path parameter name"), "{e}");
        assert!(!e.contains("self.tenant"), "{e}");
    }

    #[test]
    fn a_field_path_is_a_configuration_error() {
        for template in ["order:<order.id>", "{t:<self.tenant>}:<id>", "<pair.0>"] {
            let e = parse_template(template).unwrap_err();
            assert!(e.contains("field path") && e.contains("key_from"), "{e}");
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
        let name = HeaderName::from_static("x-account");
        let h = KeySource::Header {
            name: name.clone(),
            scoped: true,
        };
        // Outside a router: the `*` route.
        assert_eq!(
            h.build(&mut parts(&[("x-account", " acc-1 ")])).unwrap(),
            "header:*:x-account:acc-1"
        );
        // Under a route (`tests/tests/http_header_keys.rs` serves one).
        assert_eq!(
            header_key("/items/{id}", &name, "item:42"),
            "header:/items/%7Bid%7D:x-account:item%3A42"
        );
        let trusted = KeySource::Header {
            name,
            scoped: false,
        };
        assert_eq!(
            trusted
                .build(&mut parts(&[("x-account", " item:42 ")]))
                .unwrap(),
            "item:42"
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
