//! Parsing: the attribute's arguments and the function it is applied to.

use std::time::Duration;

use lock_keys::{MAX_LOCK_ALL_KEYS, MAX_TTL, MIN_TTL};
use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{
    Attribute, Block, Expr, ExprLit, ExprUnary, Ident, Lit, LitBool, LitStr, Path, Signature,
    Token, UnOp, Visibility,
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
    (
        "keys",
        "hold_at_least",
        "a lock over several keys is released when the body ends; `hold_at_least` needs a single `key`",
    ),
];

/// `#[distributed_lock(key = "...", ttl = "30s", wait = "2s", renew = false, client = expr, crate = path)]`,
/// with `keys = [...]` for `key`, `rw = "read"` or `permits = n`.
pub(crate) struct Args {
    /// The key template(s): `key` or `keys` (one of them is required).
    pub(crate) keys: Keys,
    /// The kind of lock: `rw`, `permits`, or neither (a mutex).
    pub(crate) kind: Kind,
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

/// The kind of lock, from `rw` and `permits`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Neither: one holder.
    Mutex,
    /// `rw = "read"`.
    Read,
    /// `rw = "write"`.
    Write,
    /// `permits = n`, `n >= 1`.
    Permits(u32),
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
                    "renew" => Ok(parse_bool(input)?).map(|b| renew = Some(b)),
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
        Ok(Self {
            keys,
            kind: kind.unwrap_or(Kind::Mutex),
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

/// After an unknown name: skip `= value` so the following arguments are still
/// checked.
fn skip_value(input: ParseStream<'_>) -> syn::Result<()> {
    if input.parse::<Option<Token![=]>>()?.is_some() {
        input.parse::<Expr>()?;
    }
    Ok(())
}

/// `key = "..."`. The outer `Result` is a syntax error that stops parsing;
/// the inner one a bad value, reported with the other errors (as for every
/// `parse_*` below).
fn parse_key(input: ParseStream<'_>) -> syn::Result<syn::Result<LitStr>> {
    Ok(match input.parse::<Lit>()? {
        Lit::Str(s) => Ok(s),
        other => Err(syn::Error::new(
            other.span(),
            "`key` takes a string literal, as in `key = \"order:<order_id>\"`",
        )),
    })
}

/// `keys = ["...", ...]`: string literals, at least one, at most
/// [`MAX_LOCK_ALL_KEYS`], none written twice. Each template is checked
/// against the function's parameters later, as `key` is.
fn parse_keys(input: ParseStream<'_>) -> syn::Result<syn::Result<Vec<LitStr>>> {
    const USAGE: &str = "`keys` takes a list of key templates, as in `keys = [\"account:<from>\", \"account:<to>\"]`";
    if !input.peek(syn::token::Bracket) {
        let value = input.parse::<Expr>()?;
        return Ok(Err(syn::Error::new_spanned(value, USAGE)));
    }
    let list;
    let brackets = syn::bracketed!(list in input);
    let items = Punctuated::<Lit, Token![,]>::parse_terminated(&list)?;
    if items.is_empty() {
        return Ok(Err(syn::Error::new(
            brackets.span.join(),
            "`keys` needs at least one key template, as in \
             `keys = [\"account:<from>\", \"account:<to>\"]`",
        )));
    }
    let mut errors: Option<syn::Error> = None;
    let mut push = |e: syn::Error| match &mut errors {
        Some(all) => all.combine(e),
        None => errors = Some(e),
    };
    let mut templates: Vec<LitStr> = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let Lit::Str(template) = item else {
            push(syn::Error::new(
                item.span(),
                "every entry of `keys` is a key template, a string literal such as \
                 \"account:<from>\"",
            ));
            continue;
        };
        if i == MAX_LOCK_ALL_KEYS {
            push(syn::Error::new(
                template.span(),
                format!(
                    "`keys` takes at most {MAX_LOCK_ALL_KEYS} key templates \
                     (`lock_runtime::MAX_LOCK_ALL_KEYS`); this is the {}th",
                    i + 1
                ),
            ));
        }
        if templates.iter().any(|t| t.value() == template.value()) {
            push(syn::Error::new(
                template.span(),
                format!(
                    "the key template \"{}\" is already in `keys`; each lock is named once",
                    template.value()
                ),
            ));
            continue;
        }
        templates.push(template);
    }
    Ok(errors.map_or(Ok(templates), Err))
}

/// `rw = "read"` or `rw = "write"`.
fn parse_rw(input: ParseStream<'_>) -> syn::Result<syn::Result<Kind>> {
    let value = input.parse::<Expr>()?;
    if let Expr::Lit(ExprLit {
        lit: Lit::Str(s), ..
    }) = &value
    {
        match s.value().as_str() {
            "read" => return Ok(Ok(Kind::Read)),
            "write" => return Ok(Ok(Kind::Write)),
            other => {
                return Ok(Err(syn::Error::new(
                    s.span(),
                    format!(
                        "unknown `rw` side \"{other}\"; expected \"read\" (shared with other \
                         readers) or \"write\" (exclusive)"
                    ),
                )));
            }
        }
    }
    Ok(Err(syn::Error::new_spanned(
        value,
        "`rw` takes \"read\" (shared with other readers) or \"write\" (exclusive), \
         as in `rw = \"read\"`",
    )))
}

/// `permits = n`: an integer literal from 1 to `u32::MAX`.
fn parse_permits(input: ParseStream<'_>) -> syn::Result<syn::Result<Kind>> {
    let value = input.parse::<Expr>()?;
    let range = format!("between 1 and {}", u32::MAX);
    // `new_spanned`: all of `-1`, not only the `-`.
    let error = |message: String| Ok(Err(syn::Error::new_spanned(&value, message)));
    let int = match &value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) => int,
        // `-1`
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_),
            expr,
            ..
        }) if matches!(
            &**expr,
            Expr::Lit(ExprLit {
                lit: Lit::Int(_),
                ..
            })
        ) =>
        {
            return error(format!(
                "`permits` must be {range} (the most holders at once); got {}",
                quote::ToTokens::to_token_stream(&value)
                    .to_string()
                    .replace(' ', "")
            ));
        }
        _ => {
            return error(
                "`permits` takes an integer literal, the most holders at once, \
                 as in `permits = 4`"
                    .into(),
            );
        }
    };
    if !matches!(int.suffix(), "" | "u8" | "u16" | "u32" | "u64" | "usize") {
        return error(format!(
            "`permits` is a `u32`; write it without the suffix `{}`",
            int.suffix()
        ));
    }
    match int.base10_parse::<u64>() {
        Ok(0) => error(
            "`permits` must be at least 1: a semaphore with no permits could never be taken".into(),
        ),
        Ok(n) => match u32::try_from(n) {
            Ok(n) => Ok(Ok(Kind::Permits(n))),
            Err(_) => error(format!("`permits` must be {range}; got {n}")),
        },
        Err(_) => error(format!("`permits` must be {range}")),
    }
}

fn parse_bool(input: ParseStream<'_>) -> syn::Result<bool> {
    match input.parse::<Lit>() {
        Ok(Lit::Bool(LitBool { value, .. })) => Ok(value),
        Ok(other) => Err(syn::Error::new(
            other.span(),
            "`renew` takes `true` or `false`",
        )),
        Err(e) => Err(syn::Error::new(e.span(), "`renew` takes `true` or `false`")),
    }
}

/// A human duration in a string literal (`"30s"`, `"500ms"`, `"1m 30s"`). The
/// outer `Result` is a syntax error that stops parsing; the inner one a bad
/// value, reported with the other errors.
fn parse_duration(input: ParseStream<'_>, option: &str) -> syn::Result<syn::Result<Duration>> {
    let lit = input.parse::<Lit>()?;
    let Lit::Str(s) = lit else {
        return Ok(Err(syn::Error::new(
            lit.span(),
            format!("`{option}` takes a duration string such as \"30s\", \"500ms\" or \"1m 30s\""),
        )));
    };
    let text = s.value();
    let d = match humantime::parse_duration(&text) {
        Ok(d) => d,
        Err(e) => {
            return Ok(Err(syn::Error::new(
                s.span(),
                format!(
                    "invalid duration \"{text}\" for `{option}`: {e}; \
                     write e.g. \"30s\", \"500ms\" or \"1m 30s\" \
                     (units: ms, s, m, h, d)"
                ),
            )));
        }
    };
    // The runtime refuses such leases anyway (the same limits); refusing them
    // here says so at the attribute.
    if option == "ttl" && !(MIN_TTL..=MAX_TTL).contains(&d) {
        return Ok(Err(syn::Error::new(
            s.span(),
            format!(
                "`ttl` must be between {} and {} (the lease is renewed every ttl/3 while held); \
                 got {}",
                humantime::format_duration(MIN_TTL),
                humantime::format_duration(MAX_TTL),
                humantime::format_duration(d),
            ),
        )));
    }
    if option == "hold_at_least" && d > MAX_TTL {
        return Ok(Err(syn::Error::new(
            s.span(),
            format!(
                "`hold_at_least` must be at most {} (the longest lease); got {}",
                humantime::format_duration(MAX_TTL),
                humantime::format_duration(d),
            ),
        )));
    }
    Ok(Ok(d))
}

/// The item under the attribute: a function with a body (free, or a method in
/// an `impl` or a trait's default).
pub(crate) struct LockedFn {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
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
        let block: Block = input.parse()?;
        Ok(Self {
            attrs,
            vis,
            sig,
            block,
        })
    }
}
