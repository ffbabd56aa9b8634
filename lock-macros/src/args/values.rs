//! The values of the options: a key template or a list of them, `rw`,
//! `permits`, a boolean, a duration.

use std::time::Duration;

use lock_keys::{MAX_LOCK_ALL_KEYS, MAX_TTL, MIN_TTL};
use syn::parse::ParseStream;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, ExprUnary, Lit, LitBool, LitStr, Token, UnOp};

use lock_keys::{Access, LockKind};

/// After an unknown name: skip `= value` so the following arguments are still
/// checked.
pub(super) fn skip_value(input: ParseStream<'_>) -> syn::Result<()> {
    if input.parse::<Option<Token![=]>>()?.is_some() {
        input.parse::<Expr>()?;
    }
    Ok(())
}

/// An option's value. A value passed through a `macro_rules!` fragment
/// (`$key:literal`, `$ttl:expr`) comes wrapped in an invisible group: the
/// value inside it is what was written.
fn value(input: ParseStream<'_>) -> syn::Result<Expr> {
    let mut value = input.parse::<Expr>()?;
    while let Expr::Group(group) = value {
        value = *group.expr;
    }
    Ok(value)
}

/// An option's value that must be a literal: the literal, or the span of
/// the expression written instead (a constant's name, a call), which the
/// attribute cannot read at compile time.
fn literal(input: ParseStream<'_>) -> syn::Result<Result<Lit, proc_macro2::Span>> {
    use syn::spanned::Spanned;
    Ok(match value(input)? {
        Expr::Lit(ExprLit { lit, .. }) => Ok(lit),
        other => Err(other.span()),
    })
}

/// What the message about a non-literal value adds.
const NOT_AN_EXPRESSION: &str =
    "the attribute reads it at compile time, so a constant or an expression cannot stand for it";

/// `key = "..."`. The outer `Result` is a syntax error that stops parsing;
/// the inner one a bad value, reported with the other errors (as for every
/// `parse_*` below).
pub(super) fn parse_key(input: ParseStream<'_>) -> syn::Result<syn::Result<LitStr>> {
    const USAGE: &str = "`key` takes a string literal, as in `key = \"order:<order_id>\"`";
    Ok(match literal(input)? {
        Ok(Lit::Str(s)) => Ok(s),
        Ok(other) => Err(syn::Error::new(other.span(), USAGE)),
        Err(span) => Err(syn::Error::new(
            span,
            format!("{USAGE}: {NOT_AN_EXPRESSION}"),
        )),
    })
}

/// `keys = ["...", ...]`: string literals, at least one, at most
/// [`MAX_LOCK_ALL_KEYS`], none written twice. Each template is checked
/// against the function's parameters later, as `key` is.
pub(super) fn parse_keys(input: ParseStream<'_>) -> syn::Result<syn::Result<Vec<LitStr>>> {
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

/// `rw = "read"` or `rw = "write"`: a read-write lock, shared or alone.
pub(super) fn parse_rw(input: ParseStream<'_>) -> syn::Result<syn::Result<(LockKind, Access)>> {
    let value = value(input)?;
    if let Expr::Lit(ExprLit {
        lit: Lit::Str(s), ..
    }) = &value
    {
        match s.value().as_str() {
            "read" => return Ok(Ok((LockKind::RwLock, Access::READ))),
            "write" => return Ok(Ok((LockKind::RwLock, Access::Exclusive))),
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

/// `permits = n`: an integer literal from 1 to `u32::MAX`; a semaphore,
/// shared by at most `n` holders.
pub(super) fn parse_permits(
    input: ParseStream<'_>,
) -> syn::Result<syn::Result<(LockKind, Access)>> {
    let value = value(input)?;
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
            Ok(n) => Ok(Ok((LockKind::Semaphore, Access::Shared(n)))),
            Err(_) => error(format!("`permits` must be {range}; got {n}")),
        },
        Err(_) => error(format!("`permits` must be {range}")),
    }
}

pub(super) fn parse_bool(input: ParseStream<'_>) -> syn::Result<syn::Result<bool>> {
    const USAGE: &str = "`renew` takes `true` or `false`";
    Ok(match literal(input)? {
        Ok(Lit::Bool(LitBool { value, .. })) => Ok(value),
        Ok(other) => Err(syn::Error::new(other.span(), USAGE)),
        Err(span) => Err(syn::Error::new(
            span,
            format!("{USAGE}: {NOT_AN_EXPRESSION}"),
        )),
    })
}

/// A human duration in a string literal (`"30s"`, `"500ms"`, `"1m 30s"`). The
/// outer `Result` is a syntax error that stops parsing; the inner one a bad
/// value, reported with the other errors.
pub(super) fn parse_duration(
    input: ParseStream<'_>,
    option: &str,
) -> syn::Result<syn::Result<Duration>> {
    let usage =
        format!("`{option}` takes a duration string such as \"30s\", \"500ms\" or \"1m 30s\"");
    let s = match literal(input)? {
        Ok(Lit::Str(s)) => s,
        Ok(other) => return Ok(Err(syn::Error::new(other.span(), usage))),
        Err(span) => {
            let message = format!("{usage}: {NOT_AN_EXPRESSION}");
            return Ok(Err(syn::Error::new(span, message)));
        }
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
