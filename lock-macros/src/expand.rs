//! Validation and tokens: the function, its body wrapped in one call to
//! `lock_runtime::__private::run` (or `run_all`, for `keys = [...]`).

use std::time::Duration;

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{FnArg, Ident, LitStr, Pat, ReturnType, Signature, Type};

use crate::args::{Args, Keys, LockedFn};
use lock_keys::template::{self, Placeholder, Segment};
use lock_keys::{Access, LockKind};

/// Checks the function and the arguments, reporting every error found, then
/// writes the function back with its body run under the lock.
pub(crate) fn expand(args: syn::Result<Args>, func: &LockedFn) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let ret = errors.check(check_signature(&func.sig));
    let args = errors.check(args);
    let key = args
        .as_ref()
        .and_then(|args| errors.check(keys_expr(&args.keys, &func.sig, &crate_path(args))));
    let (Some(ret), Some(args), Some(key)) = (ret, args, key) else {
        return Err(errors.into_error());
    };
    let ret_span = ret.span();

    let krate = crate_path(&args);
    // Our locals are invisible to the body (and never shadow its names).
    let client_var = Ident::new("__lock_client", Span::mixed_site());
    let key_var = Ident::new("__lock_key", Span::mixed_site());
    let client = match &args.client {
        Some(expr) => quote_spanned!(expr.span()=> #krate::__private::client(&(#expr))),
        None => quote!(::core::option::Option::None),
    };
    // Without `ttl = ...`, the client's default: no setter call.
    let ttl = args.ttl.map(|d| {
        let d = duration(d);
        quote!(.ttl(#d))
    });
    let wait = duration(args.wait.unwrap_or(Duration::ZERO));
    let renew = args.renew.unwrap_or(true);
    let hold_at_least = duration(args.hold_at_least.unwrap_or(Duration::ZERO));
    let kind = match args.kind {
        LockKind::RwLock => quote!(RwLock),
        LockKind::Semaphore => quote!(Semaphore),
        // The parser makes no other kind.
        _ => quote!(Mutex),
    };
    let access = match args.access {
        Access::Exclusive => quote!(Exclusive),
        Access::Shared(n) => quote!(Shared(#n)),
    };
    // The template, not the key: the `name` label of the lock's metrics.
    let (name, run) = match &args.keys {
        Keys::One(template) => (template.clone(), quote!(#krate::__private::run)),
        Keys::All(templates) => {
            let joined: Vec<String> = templates.iter().map(LitStr::value).collect();
            let name = LitStr::new(&joined.join(", "), templates[0].span());
            (name, quote!(#krate::__private::run_all))
        }
    };
    // The call is spanned at the return type, and names it when it can
    // (`impl Trait` cannot be written there), so that a return type that is
    // not a `Result<T, E: From<LockError>>` is reported there, by name.
    let run = respan(run, ret_span);
    // Named in one span: an error type without `From<LockError>` is then
    // reported once (its own span in the type would get a second report).
    let turbofish = if mentions_impl(quote!(#ret)) {
        quote!()
    } else {
        let ret = respan(quote!(#ret), ret_span);
        quote_spanned!(ret_span=> ::<#ret, _>)
    };
    let LockedFn {
        attrs,
        vis,
        sig,
        inner,
        block,
    } = func;
    let call = quote_spanned! {ret_span=>
        #run #turbofish(
            #client_var,
            #key_var,
            #krate::__private::Options {
                kind: #krate::__private::LockKind::#kind,
                access: #krate::__private::Access::#access,
                lock: #krate::__private::LockOptions::new()
                    .wait(#wait)
                    .renew(#renew)
                    .hold_at_least(#hold_at_least)
                    #ttl
                    .metrics_name(#name),
            },
            async move #block,
        )
        .await
    };
    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            #(#inner)*
            let #client_var = #client;
            let #key_var = #key;
            #call
        }
    })
}

/// Collects errors so that one build reports them all.
#[derive(Default)]
struct Errors(Option<syn::Error>);

impl Errors {
    fn check<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(e) => {
                match &mut self.0 {
                    Some(all) => all.combine(e),
                    None => self.0 = Some(e),
                }
                None
            }
        }
    }

    fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }

    /// The errors collected, for a step that could not go on.
    fn into_error(self) -> syn::Error {
        self.0.unwrap_or_else(|| {
            syn::Error::new(
                Span::call_site(),
                "`#[distributed_lock]` could not be expanded",
            )
        })
    }
}

/// An `async fn` returning what looks like a `Result`; gives the return type.
/// Whether it is a `Result<T, E>` with `E: From<LockError>` is left to the type
/// checker (aliases such as `io::Result<T>` are fine), with the runtime's
/// diagnostic pointing at the return type.
fn check_signature(sig: &Signature) -> syn::Result<&Type> {
    let mut errors = Errors::default();
    if sig.asyncness.is_none() {
        errors.check::<()>(Err(syn::Error::new(
            sig.fn_token.span,
            "`#[distributed_lock]` requires an `async fn`: the body runs while the lock is \
             held, and waiting for the lock is asynchronous. If this was an `async fn`, an \
             attribute above this one rewrote it first (`#[tokio::test]`, `#[tokio::main]`): \
             put `#[distributed_lock]` above it; `#[async_trait]` rewrites every method of \
             its impl first: use `async fn` in the trait itself (Rust 1.75) instead",
        )));
    }
    let ret = match &sig.output {
        ReturnType::Default => errors.check(Err(syn::Error::new(
            sig.ident.span(),
            "a `#[distributed_lock]` function must return `Result<T, E>` with \
             `E: From<lock_runtime::LockError>`, so that lock failures can be returned; \
             add a return type such as `-> Result<(), lock_runtime::LockError>`",
        ))),
        ReturnType::Type(_, ty) => errors.check(result_like(ty).map(|()| &**ty)),
    };
    match ret {
        Some(ret) if errors.0.is_none() => Ok(ret),
        _ => Err(errors.into_error()),
    }
}

fn result_like(ty: &Type) -> syn::Result<()> {
    match ty {
        // A path may name a `Result` alias; a macro may expand to one.
        Type::Path(p) if p.qself.is_none() => Ok(()),
        Type::Macro(_) => Ok(()),
        Type::Paren(p) => result_like(&p.elem),
        Type::Group(g) => result_like(&g.elem),
        _ => Err(syn::Error::new(
            ty.span(),
            "a `#[distributed_lock]` function must return `Result<T, E>` with \
             `E: From<lock_runtime::LockError>`, so that lock failures can be returned",
        )),
    }
}

/// The path of the runtime crate: `::lock_runtime`, or `crate = path`.
fn crate_path(args: &Args) -> TokenStream {
    match &args.krate {
        Some(path) => quote!(#path),
        None => quote!(::lock_runtime),
    }
}

/// The key, or for `keys = [...]` a `Vec` of every key in the order written,
/// each template checked (every error reported).
fn keys_expr(keys: &Keys, sig: &Signature, krate: &TokenStream) -> syn::Result<TokenStream> {
    let templates = match keys {
        Keys::One(template) => return key_expr(template, sig, krate),
        Keys::All(templates) => templates,
    };
    let mut errors = Errors::default();
    let keys: Vec<TokenStream> = templates
        .iter()
        .filter_map(|template| errors.check(key_expr(template, sig, krate)))
        .collect();
    errors.finish()?;
    Ok(quote!(::std::vec![#(#keys),*]))
}

/// `::std::format!("order:{}", key_part(&order_id))` for `"order:<order_id>"`,
/// spanned at the template. `KeyPart` escapes the value (`%`, `:`, `{`, `}`),
/// so a value can never spell another key's structure.
fn key_expr(lit: &LitStr, sig: &Signature, krate: &TokenStream) -> syn::Result<TokenStream> {
    let span = lit.span();
    let segments = template::parse(&lit.value()).map_err(|e| syn::Error::new(span, e))?;
    let params = Params::of(sig);
    let mut format = String::new();
    let mut values = Vec::new();
    let mut errors = Errors::default();
    for segment in segments {
        match segment {
            Segment::Text(text) => format.push_str(&text.replace('{', "{{").replace('}', "}}")),
            Segment::Placeholder(placeholder) => {
                format.push_str("{}");
                if let Some(value) = errors.check(params.value(&placeholder, span)) {
                    values.push(quote_spanned!(span=> #krate::__private::key_part(&#value)));
                }
            }
        }
    }
    errors.finish()?;
    let format = LitStr::new(&format, span);
    Ok(quote_spanned!(span=> ::std::format!(#format #(, #values)*)))
}

/// The names a key template can use: the receiver and every binding of the
/// parameters' patterns.
struct Params {
    receiver: bool,
    names: Vec<Ident>,
}

impl Params {
    fn of(sig: &Signature) -> Self {
        let mut params = Self {
            receiver: false,
            names: Vec::new(),
        };
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(_) => params.receiver = true,
                FnArg::Typed(typed) => bindings(&typed.pat, &mut params.names),
            }
        }
        params
    }

    /// The expression for `<root.fields...>`.
    fn value(&self, placeholder: &Placeholder, span: Span) -> syn::Result<TokenStream> {
        let Placeholder { root, fields } = placeholder;
        let root_tokens = if root == "self" {
            if !self.receiver {
                return Err(syn::Error::new(
                    span,
                    format!(
                        "the key placeholder `{placeholder}` uses `self`, but this function \
                         takes no `self`; {}",
                        self.expected()
                    ),
                ));
            }
            quote_spanned!(span=> self)
        } else {
            let Some(param) = self.names.iter().find(|p| p.unraw() == root) else {
                return Err(syn::Error::new(
                    span,
                    format!(
                        "no parameter named `{root}` for the key placeholder `{placeholder}`; {}",
                        self.expected()
                    ),
                ));
            };
            // Located at the placeholder (an error about its value points
            // there), resolved as the parameter is: a parameter named by a
            // `macro_rules!` caller keeps that macro's hygiene.
            let mut param = param.clone();
            param.set_span(param.span().located_at(span));
            quote!(#param)
        };
        let mut tokens = root_tokens;
        for field in fields {
            let member = member(field, span).ok_or_else(|| {
                syn::Error::new(
                    span,
                    format!("invalid field `{field}` in the key placeholder `{placeholder}`"),
                )
            })?;
            tokens = quote_spanned!(span=> #tokens.#member);
        }
        Ok(tokens)
    }

    /// "expected one of `self`, `a`, `b`" for error messages.
    fn expected(&self) -> String {
        let names: Vec<String> = self
            .receiver
            .then(|| "`self`".to_owned())
            .into_iter()
            .chain(self.names.iter().map(|n| format!("`{}`", n.unraw())))
            .collect();
        match names.len() {
            0 => "the function has no parameters".into(),
            1 => format!("the only parameter is {}", names[0]),
            _ => format!("expected one of {}", names.join(", ")),
        }
    }
}

/// A field name or tuple index; keywords become raw identifiers.
fn member(field: &str, span: Span) -> Option<TokenStream> {
    if field.bytes().all(|b| b.is_ascii_digit()) {
        let index = syn::Index {
            index: field.parse().ok()?,
            span,
        };
        return Some(quote!(#index));
    }
    let ident = match syn::parse_str::<Ident>(field) {
        Ok(_) => Ident::new(field, span),
        // `self`, `crate`, `super` and `Self` cannot be raw: not field names.
        Err(_) if !matches!(field, "self" | "crate" | "super" | "Self") => {
            Ident::new_raw(field, span)
        }
        Err(_) => return None,
    };
    Some(quote!(#ident))
}

/// Every name bound by a parameter pattern (`x`, `mut x`, `(a, b)`, `Point { x, y }`).
fn bindings(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => {
            out.push(p.ident.clone());
            if let Some((_, sub)) = &p.subpat {
                bindings(sub, out);
            }
        }
        Pat::Tuple(t) => t.elems.iter().for_each(|p| bindings(p, out)),
        Pat::TupleStruct(t) => t.elems.iter().for_each(|p| bindings(p, out)),
        Pat::Struct(s) => s.fields.iter().for_each(|f| bindings(&f.pat, out)),
        Pat::Reference(r) => bindings(&r.pat, out),
        Pat::Slice(s) => s.elems.iter().for_each(|p| bindings(p, out)),
        Pat::Type(t) => bindings(&t.pat, out),
        Pat::Paren(p) => bindings(&p.pat, out),
        _ => {}
    }
}

/// Whether `tokens` contain `impl` (an `impl Trait` type).
fn mentions_impl(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|tt| match tt {
        TokenTree::Ident(i) => i == "impl",
        TokenTree::Group(g) => mentions_impl(g.stream()),
        _ => false,
    })
}

/// `tokens`, every one spanned at `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|tt| match tt {
            TokenTree::Group(g) => {
                let mut group = Group::new(g.delimiter(), respan(g.stream(), span));
                group.set_span(span);
                TokenTree::Group(group)
            }
            mut tt => {
                tt.set_span(span);
                tt
            }
        })
        .collect()
}

/// `::core::time::Duration::new(secs, nanos)`.
fn duration(d: Duration) -> TokenStream {
    let secs = d.as_secs();
    let nanos = d.subsec_nanos();
    quote!(::core::time::Duration::new(#secs, #nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(s: &str) -> Signature {
        syn::parse_str(s).unwrap()
    }

    fn key(template: &str, signature: &str) -> Result<String, String> {
        key_expr(
            &LitStr::new(template, Span::call_site()),
            &sig(signature),
            &quote!(::lock_runtime),
        )
        .map(|t| t.to_string())
        .map_err(|e| e.to_string())
    }

    #[test]
    fn placeholders_become_format_arguments() {
        let k = key(
            "{t:<self.tenant>}:order:<order.id>:<pair.0>",
            "async fn f(&self, order: &Order, pair: (u8, u8)) -> R",
        )
        .unwrap();
        assert!(k.contains(r#""{{t:{}}}:order:{}:{}""#), "{k}");
        assert!(k.contains("self . tenant"), "{k}");
        assert!(k.contains("order . id"), "{k}");
        assert!(k.contains("pair . 0"), "{k}");
    }

    #[test]
    fn pattern_bindings_and_raw_names_are_parameters() {
        assert!(
            key(
                "<a>:<y>",
                "async fn f((a, b): (u8, u8), P { x, y }: P) -> R"
            )
            .is_ok()
        );
        assert!(key("<type>", "async fn f(r#type: u8) -> R").is_ok());
        assert!(
            key("<m.type>", "async fn f(m: M) -> R")
                .unwrap()
                .contains("r#type")
        );
    }

    #[test]
    fn unknown_placeholders_list_the_parameters() {
        let e = key("<orderid>", "async fn f(order_id: u64, amount: u64) -> R").unwrap_err();
        assert!(e.contains("no parameter named `orderid`"), "{e}");
        assert!(e.contains("expected one of `order_id`, `amount`"), "{e}");
        let e = key("<self.x>", "async fn f(a: u8) -> R").unwrap_err();
        assert!(e.contains("takes no `self`"), "{e}");
        assert!(e.contains("the only parameter is `a`"), "{e}");
        let e = key("<x>", "async fn f() -> R").unwrap_err();
        assert!(e.contains("the function has no parameters"), "{e}");
    }

    #[test]
    fn keys_become_a_vec_in_the_order_written_and_every_bad_template_is_reported() {
        let lit = |t: &str| LitStr::new(t, Span::call_site());
        let all = |templates: &[&str], signature: &str| {
            let keys = Keys::All(templates.iter().map(|t| lit(t)).collect());
            keys_expr(&keys, &sig(signature), &quote!(::lock_runtime))
                .map(|t| t.to_string())
                .map_err(|e| e.into_iter().map(|e| e.to_string()).collect::<Vec<_>>())
        };
        let k = all(&["b:<to>", "a:<from>"], "async fn f(from: u8, to: u8) -> R").unwrap();
        assert!(k.starts_with(":: std :: vec !"), "{k}");
        assert!(
            k.find(r#""b:{}""#).unwrap() < k.find(r#""a:{}""#).unwrap(),
            "{k}"
        );
        let e = all(&["<x>", "<from>", "<y"], "async fn f(from: u8) -> R").unwrap_err();
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].contains("no parameter named `x`"), "{e:?}");
        assert!(e[1].contains("unclosed `<`"), "{e:?}");
    }

    #[test]
    fn non_async_and_non_result_signatures_are_refused() {
        assert!(check_signature(&sig("async fn f() -> Result<(), E>")).is_ok());
        assert!(check_signature(&sig("async fn f() -> io::Result<()>")).is_ok());
        let e = check_signature(&sig("fn f() -> Result<(), E>")).unwrap_err();
        assert!(e.to_string().contains("requires an `async fn`"));
        assert!(check_signature(&sig("async fn f()")).is_err());
        assert!(check_signature(&sig("async fn f() -> (u8, u8)")).is_err());
        assert!(check_signature(&sig("async fn f() -> impl Sized")).is_err());
    }
}
