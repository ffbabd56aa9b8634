//! Parsing: the attribute's arguments and the function it is applied to.

use std::time::Duration;

use lock_keys::{MAX_TTL, MIN_TTL};
use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{
    Attribute, Block, Expr, Ident, Lit, LitBool, LitStr, Path, Signature, Token, Visibility,
};

/// The options, in the order the docs list them.
const OPTIONS: &[&str] = &[
    "key",
    "ttl",
    "wait",
    "renew",
    "hold_at_least",
    "client",
    "crate",
];

/// `#[distributed_lock(key = "...", ttl = "30s", wait = "2s", renew = false, client = expr, crate = path)]`.
pub(crate) struct Args {
    /// The key template (required).
    pub(crate) key: LitStr,
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

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut key = None;
        let mut ttl = None;
        let mut wait = None;
        let mut renew = None;
        let mut hold_at_least = None;
        let mut client = None;
        let mut krate = None;
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
                let repeated = match option.as_str() {
                    "key" => key.replace(parse_key(input)?).is_some(),
                    "ttl" | "wait" | "hold_at_least" => {
                        let slot = match option.as_str() {
                            "ttl" => &mut ttl,
                            "wait" => &mut wait,
                            _ => &mut hold_at_least,
                        };
                        match parse_duration(input, &option)? {
                            Ok(d) => slot.replace(d).is_some(),
                            Err(e) => {
                                push(e);
                                false
                            }
                        }
                    }
                    "renew" => renew.replace(parse_bool(input)?).is_some(),
                    "client" => client.replace(input.parse::<Expr>()?).is_some(),
                    _ => krate.replace(input.parse::<Path>()?).is_some(),
                };
                if repeated {
                    push(syn::Error::new(
                        name.span(),
                        format!("duplicate argument `{option}`; each argument may appear once"),
                    ));
                }
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }

        if key.is_none() {
            push(missing_key());
        }
        if let Some(e) = errors {
            return Err(e);
        }
        let Some(key) = key else {
            return Err(missing_key());
        };
        Ok(Self {
            key,
            ttl,
            wait,
            renew,
            hold_at_least,
            client,
            krate,
        })
    }
}

/// Spanned at the whole attribute: there is no `key` to point at.
fn missing_key() -> syn::Error {
    syn::Error::new(
        Span::call_site(),
        "missing argument `key`: name the lock, as in \
         `#[distributed_lock(key = \"order:<order_id>\")]`",
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

fn parse_key(input: ParseStream<'_>) -> syn::Result<LitStr> {
    match input.parse::<Lit>()? {
        Lit::Str(s) => Ok(s),
        other => Err(syn::Error::new(
            other.span(),
            "`key` takes a string literal, as in `key = \"order:<order_id>\"`",
        )),
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
fn parse_duration(
    input: ParseStream<'_>,
    option: &str,
) -> syn::Result<Result<Duration, syn::Error>> {
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
