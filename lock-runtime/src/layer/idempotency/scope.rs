//! Whose records a request may see: the scope of an idempotency record.

use std::fmt;
use std::sync::Arc;

use http::header::{AUTHORIZATION, COOKIE};
use http::request::Parts;

use super::key::digest;

/// A closure naming whose records a request may see (the principal).
pub(crate) type ScopeFn = Arc<dyn Fn(&Parts) -> String + Send + Sync + 'static>;

/// How a layer scopes its records.
#[derive(Clone)]
pub(crate) enum Scope {
    /// The default: the request's credentials, hashed (see [`credentials`]).
    Credentials,
    /// Set with [`IdempotencyLayer::scope`](super::IdempotencyLayer::scope).
    Custom(ScopeFn),
    /// Set with [`IdempotencyLayer::records_shared_by_all_callers`](super::IdempotencyLayer::records_shared_by_all_callers).
    SharedByAllCallers,
}

impl Scope {
    /// The scope of the request `parts`.
    pub(crate) fn of(&self, parts: &Parts) -> String {
        match self {
            Scope::Credentials => credentials(parts),
            Scope::Custom(f) => f(parts),
            Scope::SharedByAllCallers => String::new(),
        }
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scope::Credentials => "credentials (Authorization, Cookie, X-Api-Key)",
            Scope::Custom(_) => "custom",
            Scope::SharedByAllCallers => "shared by all callers",
        })
    }
}

/// The API-key header many APIs authenticate with.
const X_API_KEY: &str = "x-api-key";

/// The default scope: the SHA-256 (hex) of the request's credentials, its
/// `Authorization` header values, its cookies (every `Cookie` header, split
/// into `name=value` pairs, sorted, so their order does not count) and its
/// `X-Api-Key` values, or the empty scope for a request with none (as
/// records were named before there was a default scope, so an anonymous API
/// keeps its records over an upgrade; a request without `X-Api-Key` keeps
/// the scope of the versions that did not read it). Two requests whose
/// credentials differ in any way never share a record; the credentials
/// themselves are never kept (the hash goes into the record's name, itself
/// a hash).
pub(crate) fn credentials(parts: &Parts) -> String {
    let values = |name| -> Vec<&[u8]> {
        let all = parts.headers.get_all(name).iter();
        all.map(|v| v.as_bytes()).collect()
    };
    let authorization = values(AUTHORIZATION.as_str());
    let mut cookies: Vec<&[u8]> = parts
        .headers
        .get_all(COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b';'))
        .map(<[u8]>::trim_ascii)
        .filter(|pair| !pair.is_empty())
        .collect();
    let keys = values(X_API_KEY);
    if authorization.is_empty() && cookies.is_empty() && keys.is_empty() {
        return String::new();
    }
    cookies.sort_unstable();
    // Length-prefixed parts, and separators no header value can be: the
    // number of `Authorization` values, so no Authorization value can pose
    // as a cookie, and with API keys the number of cookies and the header's
    // name, so no cookie can pose as a key.
    let count = authorization.len().to_be_bytes();
    let cookie_count = cookies.len().to_be_bytes();
    let mut parts: Vec<&[u8]> = vec![&count];
    parts.extend(authorization);
    if !keys.is_empty() {
        parts.push(&cookie_count);
        parts.extend(cookies);
        parts.push(X_API_KEY.as_bytes());
        parts.extend(keys);
    } else {
        parts.extend(cookies);
    }
    format!("credentials:{}", digest(&parts, b""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope_of(headers: &[(&str, &str)]) -> String {
        let mut req = http::Request::builder();
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        credentials(&req.body(()).unwrap().into_parts().0)
    }

    #[test]
    fn different_credentials_never_share_a_scope_and_are_never_in_it() {
        let alice = scope_of(&[("authorization", "Bearer alice-token")]);
        let bob = scope_of(&[("authorization", "Bearer bob-token")]);
        assert_ne!(alice, bob);
        assert_eq!(alice, scope_of(&[("authorization", "Bearer alice-token")]));
        assert!(!alice.contains("alice"), "{alice}");
        assert_eq!(alice.len(), "credentials:".len() + 64);
        assert_eq!(scope_of(&[]), "");
        assert_ne!(alice, scope_of(&[]));
        // Cookies count, whatever their order or spacing.
        let s1 = scope_of(&[("cookie", "session=s1; theme=dark")]);
        assert_eq!(s1, scope_of(&[("cookie", "theme=dark;session=s1")]));
        assert_eq!(
            s1,
            scope_of(&[("cookie", "theme=dark"), ("cookie", "session=s1")])
        );
        assert_ne!(s1, scope_of(&[("cookie", "session=s2; theme=dark")]));
        assert!(!s1.contains("s1;") && !s1.contains("session"));
        // An Authorization value cannot pose as a cookie, nor the reverse.
        assert_ne!(
            scope_of(&[("authorization", "a=1")]),
            scope_of(&[("cookie", "a=1")])
        );
        assert_ne!(
            alice,
            scope_of(&[("authorization", "Bearer alice-token"), ("cookie", "x=1")])
        );
    }

    /// An API that authenticates with `X-Api-Key` keeps its callers apart
    /// by default (they all shared the anonymous scope, so one caller was
    /// replayed another's stored response).
    #[test]
    fn api_keys_are_credentials_and_cannot_pose_as_cookies() {
        let alice = scope_of(&[("x-api-key", "alice-key")]);
        let bob = scope_of(&[("x-api-key", "bob-key")]);
        assert_ne!(alice, bob);
        assert_ne!(alice, scope_of(&[]));
        assert!(!alice.contains("alice"), "{alice}");
        assert_ne!(
            scope_of(&[("cookie", "a=1")]),
            scope_of(&[("x-api-key", "a=1")])
        );
        assert_ne!(
            scope_of(&[("cookie", "a=1"), ("x-api-key", "k")]),
            scope_of(&[("x-api-key", "a=1"), ("x-api-key", "k")])
        );
        // Without a key, the scope earlier versions gave.
        let s1 = scope_of(&[("authorization", "Bearer t"), ("cookie", "s=1")]);
        assert_eq!(s1, {
            let count = 1usize.to_be_bytes();
            let parts: Vec<&[u8]> = vec![&count, b"Bearer t", b"s=1"];
            format!("credentials:{}", digest(&parts, b""))
        });
    }
}
