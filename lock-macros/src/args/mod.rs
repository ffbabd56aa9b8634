//! Parsing: the attribute's arguments and the function it is applied to.

use std::time::Duration;

use lock_keys::{Access, LockKind};
use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Block, Expr, Ident, LitStr, Path, Signature, Token, Visibility};

mod values;

use values::{
    parse_bool, parse_duration, parse_key, parse_keys, parse_permits, parse_rw, skip_value,
};

/// The options, in the order the docs list them.
const OPTIONS: &[&str] = &[
    "key",
    "keys",
    "rw",
    "permits",
    "ttl",
    "wait",
    "renew",
    "hold_at_least",
    "client",
    "crate",
];

/// Pairs of options that cannot be written together, with why.
const CONFLICTS: &[(&str, &str, &str)] = &[
    (
        "key",
        "keys",
        "`key` names one lock and `keys = [...]` several; write the one key into `keys`, or drop `keys`",
    ),
    (
        "keys",
        "rw",
        "`keys = [...]` takes plain locks, all or none; there is no read-write lock over several keys",
    ),
    (
        "keys",
        "permits",
        "`keys = [...]` takes plain locks, all or none; there is no semaphore over several keys",
    ),
    (
        "rw",
        "permits",
        "a lock is a read-write lock (`rw`) or a semaphore (`permits`), not both",
    ),
];

/// `#[distributed_lock(key = "...", ttl = "30s", wait = "2s", renew = false, client = expr, crate = path)]`,
/// with `keys = [...]` for `key`, `rw = "read"` or `permits = n`.
pub(crate) struct Args {
    /// The key template(s): `key` or `keys` (one of them is required).
    pub(crate) keys: Keys,
    /// The kind of lock: `rw` (a read-write lock), `permits` (a
    /// semaphore), or neither (a mutex).
    pub(crate) kind: LockKind,
    /// How it is taken: `rw`'s side, `permits`' count; alone for a mutex.
    pub(crate) access: Access,
    /// The lease; `None`: the client's default.
    pub(crate) ttl: Option<Duration>,
    /// How long to wait for a busy lock; `None`: try once.
    pub(crate) wait: Option<Duration>,
    /// Whether the watchdog renews the lease; `None`: yes.
    pub(crate) renew: Option<bool>,
    /// How long the key stays taken at least, even if the body ends
    /// sooner; `None`: a release frees it at once.
    pub(crate) hold_at_least: Option<Duration>,
    /// The client expression; `None`: the global client.
    pub(crate) client: Option<Expr>,
    /// The path of the runtime crate; `None`: `::lock_runtime`.
    pub(crate) krate: Option<Path>,
}

/// `key = "..."` or `keys = ["...", ...]`.
pub(crate) enum Keys {
    /// One lock.
    One(LitStr),
    /// Several locks, all or none: at least one, at most
    /// [`MAX_LOCK_ALL_KEYS`], no template twice.
    All(Vec<LitStr>),
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut key = None;
        let mut keys = None;
        let mut kind = None;
        let mut ttl = None;
        let mut wait = None;
        let mut renew = None;
        let mut hold_at_least = None;
        let mut client = None;
        let mut krate = None;
        // The options written, in order, for the combination checks.
        let mut written: Vec<Ident> = Vec::new();
        // Every error found, so that one build reports them all.
        let mut errors: Option<syn::Error> = None;
        let mut push = |e: syn::Error| match &mut errors {
            Some(all) => all.combine(e),
            None => errors = Some(e),
        };

        while !input.is_empty() {
            if let Some(lit) = input.parse::<Option<LitStr>>()? {
                // `#[distributed_lock("order:<id>")]`: every option is named.
                return Err(syn::Error::new(
                    lit.span(),
                    format!(
                        "the key template is named: write `key = \"{}\"` (every option is \
                         `name = value`)",
                        lit.value().escape_debug()
                    ),
                ));
            }
            // `parse_any`: `crate` is a keyword.
            let name = Ident::parse_any(input)?;
            let option = name.to_string();
            if !OPTIONS.contains(&option.as_str()) {
                push(syn::Error::new(
                    name.span(),
                    format!("unknown argument `{option}`; expected one of {}", choices()),
                ));
                skip_value(input)?;
            } else {
                if !input.peek(Token![=]) {
                    return Err(syn::Error::new(
                        name.span(),
                        format!("expected `=` after `{option}`, as in {}", example(&option)),
                    ));
                }
                input.parse::<Token![=]>()?;
                let repeated = written.contains(&name);
                // A value that parses but is refused is reported with the
                // other errors; a syntax error stops here.
                let value: Result<(), syn::Error> = match option.as_str() {
                    "key" => parse_key(input)?.map(|k| key = Some(k)),
                    "keys" => parse_keys(input)?.map(|k| keys = Some(k)),
                    "rw" => parse_rw(input)?.map(|k| kind = Some(k)),
                    "permits" => parse_permits(input)?.map(|k| kind = Some(k)),
                    "ttl" | "wait" | "hold_at_least" => {
                        let slot = match option.as_str() {
                            "ttl" => &mut ttl,
                            "wait" => &mut wait,
                            _ => &mut hold_at_least,
                        };
                        parse_duration(input, &option)?.map(|d| *slot = Some(d))
                    }
                    "renew" => parse_bool(input)?.map(|b| renew = Some(b)),
                    "client" => Ok(input.parse::<Expr>()?).map(|e| client = Some(e)),
                    _ => Ok(input.parse::<Path>()?).map(|p| krate = Some(p)),
                };
                if let Err(e) = value {
                    push(e);
                }
                if repeated {
                    push(syn::Error::new(
                        name.span(),
                        format!("duplicate argument `{option}`; each argument may appear once"),
                    ));
                } else {
                    written.push(name);
                }
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }

        check_combinations(&written).into_iter().for_each(&mut push);
        let named = |option: &str| written.iter().any(|w| w == option);
        if !named("key") && !named("keys") {
            push(missing_key());
        }
        if let Some(e) = errors {
            return Err(e);
        }
        let keys = match (key, keys) {
            (Some(key), None) => Keys::One(key),
            (None, Some(keys)) => Keys::All(keys),
            _ => return Err(missing_key()),
        };
        let (kind, access) = kind.unwrap_or((LockKind::Mutex, Access::Exclusive));
        Ok(Self {
            keys,
            kind,
            access,
            ttl,
            wait,
            renew,
            hold_at_least,
            client,
            krate,
        })
    }
}

/// An error at the later of every two options that cannot go together.
fn check_combinations(written: &[Ident]) -> Vec<syn::Error> {
    let position = |option: &str| written.iter().position(|w| w == option);
    CONFLICTS
        .iter()
        .filter_map(|&(a, b, why)| {
            let (i, j) = (position(a)?, position(b)?);
            let later = &written[i.max(j)];
            Some(syn::Error::new(
                later.span(),
                format!("`{a}` and `{b}` cannot be used together: {why}"),
            ))
        })
        .collect()
}

/// Spanned at the whole attribute: there is no `key` to point at.
fn missing_key() -> syn::Error {
    syn::Error::new(
        Span::call_site(),
        "missing argument `key` or `keys`: name the lock, as in \
         `#[distributed_lock(key = \"order:<order_id>\")]`, or several locks taken \
         all or none, as in `#[distributed_lock(keys = [\"account:<from>\", \"account:<to>\"])]`",
    )
}

/// "`key`, `ttl`, ..." for error messages.
fn choices() -> String {
    OPTIONS
        .iter()
        .map(|o| format!("`{o}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn example(option: &str) -> &'static str {
    match option {
        "key" => "`key = \"order:<order_id>\"`",
        "keys" => "`keys = [\"account:<from>\", \"account:<to>\"]`",
        "rw" => "`rw = \"read\"`",
        "permits" => "`permits = 4`",
        "ttl" => "`ttl = \"30s\"`",
        "wait" => "`wait = \"2s\"`",
        "renew" => "`renew = false`",
        "hold_at_least" => "`hold_at_least = \"5m\"`",
        "client" => "`client = self.locks`",
        _ => "`crate = ::my_crate::lock_runtime`",
    }
}

/// The item under the attribute: a function with a body (free, or a method in
/// an `impl` or a trait's default).
pub(crate) struct LockedFn {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    /// The body's inner attributes (`#![allow(..)]`), for the function's
    /// body as made.
    pub(crate) inner: Vec<Attribute>,
    pub(crate) block: Block,
}

impl Parse for LockedFn {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let lookahead = input.lookahead1();
        if !(lookahead.peek(Token![fn])
            || lookahead.peek(Token![async])
            || lookahead.peek(Token![const])
            || lookahead.peek(Token![unsafe])
            || lookahead.peek(Token![extern]))
        {
            return Err(syn::Error::new(
                input.span(),
                "`#[distributed_lock]` applies to an `async fn`",
            ));
        }
        let sig: Signature = input.parse()?;
        if input.peek(Token![;]) {
            return Err(syn::Error::new(
                sig.ident.span(),
                "`#[distributed_lock]` needs a function body to run under the lock",
            ));
        }
        let body;
        let brace_token = syn::braced!(body in input);
        let inner = body.call(Attribute::parse_inner)?;
        let stmts = body.call(Block::parse_within)?;
        let block = Block { brace_token, stmts };
        Ok(Self {
            attrs,
            vis,
            sig,
            inner,
            block,
        })
    }
}
