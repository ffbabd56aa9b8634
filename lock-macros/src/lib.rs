//! The `#[distributed_lock]` attribute. Use it through
//! [`lock_runtime::distributed_lock`](https://docs.rs/lock-runtime); this crate
//! is an implementation detail of `lock-runtime`, pinned to its exact version.

mod args;
mod expand;

use proc_macro::TokenStream;

/// Runs an `async fn` under a distributed lock whose key is built from its
/// arguments.
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::{LockClient, LockError, distributed_lock};
///
/// #[derive(Debug)]
/// enum AppError {
///     Lock(LockError),
///     Declined,
/// }
///
/// impl From<LockError> for AppError {
///     fn from(e: LockError) -> Self {
///         AppError::Lock(e)
///     }
/// }
///
/// #[distributed_lock(key = "order:<order_id>", ttl = "30s", wait = "2s")]
/// async fn pay(order_id: u64, amount: u64) -> Result<u64, AppError> {
///     // Only one process at a time gets here for a given order.
///     let fence = lock_runtime::current_lock().unwrap().fencing_token().await?;
///     if amount == 0 {
///         return Err(AppError::Declined);
///     }
///     Ok(fence) // pass `fence` with every write to storage
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), AppError> {
/// // Once, at startup: the client the attribute uses by default.
/// let client = LockClient::builder().memory().build().await?; // .redis(url) in production
/// lock_runtime::set_global_client(client);
///
/// assert_eq!(pay(42, 100).await?, 1);
/// assert_eq!(pay(42, 100).await?, 2);
/// assert!(matches!(pay(42, 0).await, Err(AppError::Declined)));
/// # Ok(())
/// # }
/// ```
///
/// # Fencing the write
///
/// The fencing token is what makes a holder paused past its lease harmless,
/// if the write it protects is refused when stale: pass it to
/// `lock_runtime::fence`, which checks it in the store, atomically with the
/// write.
///
/// ```no_run
/// use lock_runtime::{LockError, distributed_lock, fence, redis};
///
/// #[distributed_lock(key = "order:<order_id>", ttl = "30s", wait = "2s")]
/// async fn mark_paid(
///     redis: &mut redis::aio::MultiplexedConnection,
///     order_id: u64,
/// ) -> Result<(), LockError> {
///     let token = lock_runtime::current_lock().unwrap().fencing_token().await?;
///     let order = format!("order:{order_id}");
///     fence::redis(redis, &order, token)
///         .cmd(redis::cmd("HSET").arg(&order).arg("status").arg("paid"))
///         .run()
///         .await?; // Err(LockError::Stale { .. }) if a later holder wrote first
///     Ok(())
/// }
/// ```
///
/// # The same code without the attribute
///
/// The attribute keeps the signature and wraps the body; `pay` above is
///
/// ```
/// # use std::time::Duration;
/// # use lock_runtime::LockError;
/// # #[derive(Debug)] enum AppError { Lock(LockError) }
/// # impl From<LockError> for AppError { fn from(e: LockError) -> Self { AppError::Lock(e) } }
/// async fn pay(order_id: u64, amount: u64) -> Result<u64, AppError> {
///     let client = lock_runtime::global_client().ok_or(LockError::NoClient)?;
///     let key = format!("order:{}", lock_runtime::escape_key_part(&order_id.to_string())); // before the body runs
///     client
///         .lock(key)
///         .ttl(Duration::from_secs(30))
///         .wait(Duration::from_secs(2))
///         .run(async move {
///             // the body, unchanged
/// #           let _ = amount;
/// #           Ok(lock_runtime::current_lock().unwrap().fencing_token().await?)
///         })
///         .await
///         .unwrap_or_else(|lock_error| Err(AppError::from(lock_error)))
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # lock_runtime::set_global_client(lock_runtime::LockClient::builder().memory().build().await.unwrap());
/// # assert_eq!(pay(1, 1).await.unwrap(), 1);
/// # }
/// ```
///
/// and with `client = self.locks`, `lock_runtime::global_client()` becomes
/// `self.locks.clone()`; with `rw = "read"`, `client.lock(key)` becomes
/// `client.rw_lock(key).read()`; with `permits = 4`, `client.semaphore(key, 4)`;
/// with `keys = [...]`, `client.lock_all(vec![key_1, key_2])`. The actual
/// expansion is one call into `lock_runtime::__private`, which does the above.
///
/// # Key templates
///
/// `key` is a string in which `<...>` is a placeholder for a value, rendered
/// with [`Display`](std::fmt::Display):
///
/// | placeholder | value |
/// |---|---|
/// | `<order_id>` | the parameter `order_id` (any name bound by a parameter pattern) |
/// | `<order.id>`, `<pair.0>` | a field (or tuple field) of a parameter, at any depth |
/// | `<self.tenant>` | a field of `self`, in methods |
///
/// Everything else is literal, **braces included**, so Redis Cluster hash tags
/// can be written: `"{tenant:<self.tenant>}:order:<order.id>"` puts all of a
/// tenant's keys in one slot. Write `<<` and `>>` for a literal `<` and `>`.
///
/// A placeholder naming no parameter is a compile error at the key, listing the
/// parameters; a field that does not exist or a value that is not `Display` is
/// a type error at the key. The key is computed when the function's future is
/// first polled, before the body runs (and before it can move the arguments).
/// A rendered key that is longer than `lock_runtime::MAX_KEY_LEN` bytes or
/// contains control characters is refused then, with `LockError::InvalidKey`,
/// and the body does not run; a template that could never render a valid key
/// (control characters, or literal text alone over the limit) is a compile
/// error. `LockLayer::key` templates follow the same grammar, with path
/// parameters as the only placeholders.
///
/// **Values are escaped.** Each value is rendered with `Display`, then `%`,
/// `:`, `{` and `}` in it become `%25`, `%3A`, `%7B` and `%7D` (as by
/// `lock_runtime::escape_key_part`), so a value can never write a separator or
/// close a hash tag: with `"<tenant>:<order>"`, tenant `"a:b"` order `"c"`
/// renders `"a%3Ab:c"` and tenant `"a"` order `"b:c"` renders `"a:b%3Ac"`, two
/// different locks. Separate placeholders with literal text.
///
/// # Options
///
/// | option | meaning | default |
/// |---|---|---|
/// | `key = "..."` | the key template (this or `keys` is required) | |
/// | `keys = ["...", "..."]` | several key templates instead of `key`: the body runs holding all of those locks, taken all or none and without deadlock whatever order callers name them in (`LockClient::lock_all`); each is the lock `key = "..."` would take; 1 to 64 templates, none twice; templates that render the same key (`transfer(1, 1)`) take that lock once | |
/// | `rw = "read"` or `rw = "write"` | a read-write lock: many readers at once, or one writer (`LockClient::rw_lock`); not with `keys` or `permits` | a mutex |
/// | `permits = 4` | a semaphore: at most this many holders at once (`LockClient::semaphore`); an integer literal, 1 to `u32::MAX`; not with `keys` or `rw` | a mutex |
/// | `ttl = "30s"` | the lease, renewed every ttl/3 while the body runs; 50ms to 7 days | the client's `default_ttl` |
/// | `wait = "2s"` | how long to wait for a busy lock, then `LockError::Busy` | try once |
/// | `renew = false` | a fixed lease: the body is cancelled when it runs out | `true` |
/// | `hold_at_least = "5m"` | the key stays taken until this long after it was acquired, even if the body ends sooner (scheduled jobs on many pods: at most one run per interval); at most 7 days; with `keys`, every key | none: the key is released when the body ends |
/// | `client = <expr>` | the client: a `LockClient`, `&LockClient`, `Arc<LockClient>`, `self.locks`, ... evaluated (and cloned) before the body | the global client |
/// | `crate = <path>` | where `lock_runtime` is, for crates that re-export it | `::lock_runtime` |
///
/// Durations are [humantime](https://docs.rs/humantime) strings: `"500ms"`,
/// `"30s"`, `"2m"`, `"1m 30s"`. Unknown or repeated options, invalid
/// durations, `rw` or `permits` values other than those above, and options
/// that do not go together (`key` with `keys`; `rw` with `permits`; `keys`
/// with `rw` or `permits`) are compile errors at the option.
/// Inside a `macro_rules!` macro, the values may be its fragments
/// (`key = $key` for a `$key:literal`), and a placeholder may name a
/// parameter the macro's caller named.
///
/// # Read-write locks, semaphores, several keys
///
/// ```
/// use lock_runtime::{LockClient, LockError, distributed_lock};
///
/// /// Readers of one catalog entry run together; a writer runs alone.
/// #[distributed_lock(key = "catalog:<id>", rw = "read", wait = "2s")]
/// async fn price(id: u64) -> Result<u64, LockError> {
///     Ok(id * 100)
/// }
///
/// #[distributed_lock(key = "catalog:<id>", rw = "write", wait = "2s")]
/// async fn set_price(id: u64, price: u64) -> Result<(), LockError> {
///     Ok(())
/// }
///
/// /// At most 4 exports per tenant at once, across every process.
/// #[distributed_lock(key = "exports:<tenant>", permits = 4, wait = "30s")]
/// async fn export(tenant: &str) -> Result<(), LockError> {
///     Ok(())
/// }
///
/// /// Both accounts or neither: two opposite transfers never deadlock.
/// #[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "2s")]
/// async fn transfer(from: u64, to: u64, amount: u64) -> Result<u64, LockError> {
///     Ok(amount)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// # lock_runtime::set_global_client(LockClient::builder().memory().build().await?);
/// let (a, b) = tokio::join!(price(7), price(7));
/// assert_eq!((a?, b?), (700, 700));
/// set_price(7, 800).await?;
/// export("acme").await?;
/// let (a, b) = tokio::join!(transfer(1, 2, 10), transfer(2, 1, 5));
/// assert_eq!((a?, b?), (10, 5));
/// # Ok(())
/// # }
/// ```
///
/// # Semantics
///
/// Exactly those of [`LockRequest::run`](https://docs.rs/lock-runtime/latest/lock_runtime/struct.LockRequest.html#method.run)
/// (with `keys`, of [`LockAllRequest::run`](https://docs.rs/lock-runtime/latest/lock_runtime/struct.LockAllRequest.html#method.run)):
///
/// * acquire, waiting up to `wait`; run the body while the watchdog renews the
///   lease; release when the body returns, fails or panics;
/// * if the lease is lost, the body is dropped at its next `.await` and the
///   function returns `Err(LockError::Lost { .. }.into())`;
/// * reentrant per task: a locked function that calls another one with the same
///   key (on the same client) re-enters instead of deadlocking;
/// * `lock_runtime::current_lock()` gives the body its key and fencing token.
///
/// Lock failures (`Busy`, `Lost`, `Backend`, `Config`, `InvalidKey`, `NoClient`)
/// are returned through `From<LockError>` for the function's error type.
/// Without `client = ...` and with no client installed by
/// `lock_runtime::set_global_client`, the function returns
/// `LockError::NoClient`, whose message says how to install one.
///
/// # Requirements
///
/// * an `async fn` (free, or a method taking `&self`, `&mut self` or `self`;
///   generics, `impl Trait` arguments and any visibility work);
/// * a return type `Result<T, E>` (or an alias such as `anyhow::Result<T>`)
///   with `E: From<LockError>`.
///
/// The returned future is `Send` when the body is. Other attributes such as
/// `#[tracing::instrument]` may come before or after this one; attributes
/// that turn the `async fn` into something else (`#[tokio::test]`,
/// `#[tokio::main]`) must come after (below) it, since the attribute on top
/// runs first. `#[async_trait]` rewrites the methods of its impl before
/// their own attributes run: write `async fn` in the trait instead (Rust
/// 1.75), which works as any method.
///
/// Nested locked calls in one task re-enter the lock (see
/// `lock_runtime`'s reentrancy): a re-entered call takes no lock of its own,
/// so its own options (`ttl`, `wait`, `hold_at_least`) do not apply, the
/// outer hold's do; and calls run side by side within the task (`join!`,
/// `select!`, `FuturesUnordered` inside a locked body) all re-enter, so
/// they are not kept apart from each other. Spawn them as tasks to make
/// them take turns.
///
/// Placeholders name parameters and fields by ASCII identifiers.
///
/// ```
/// use std::sync::Arc;
/// use lock_runtime::{LockClient, LockError, distributed_lock};
///
/// struct Orders {
///     tenant: String,
///     locks: Arc<LockClient>,
/// }
///
/// struct NewOrder {
///     id: u64,
/// }
///
/// impl Orders {
///     #[distributed_lock(key = "{tenant:<self.tenant>}:order:<order.id>", client = self.locks)]
///     async fn create(&self, order: &NewOrder) -> Result<String, LockError> {
///         Ok(lock_runtime::current_lock().unwrap().key)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let locks = Arc::new(LockClient::builder().memory().build().await?);
/// let orders = Orders { tenant: "acme".into(), locks };
/// assert_eq!(orders.create(&NewOrder { id: 7 }).await?, "{tenant:acme}:order:7");
/// # Ok(())
/// # }
/// ```
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let func = match syn::parse::<args::LockedFn>(item.clone()) {
        Ok(func) => func,
        Err(e) => return with_error(item, e),
    };
    match expand::expand(syn::parse::<args::Args>(args), &func) {
        Ok(tokens) => tokens.into(),
        Err(e) => with_error(item, e),
    }
}

/// The item unchanged plus the errors, so that the rest of the crate still
/// sees the function (fewer follow-up errors, working IDE completion). Its
/// parameters that only the key named are unused in it: no warning of that
/// beside the error.
fn with_error(item: TokenStream, error: syn::Error) -> TokenStream {
    let mut out = TokenStream::from(quote::quote!(#[allow(unused_variables)]));
    out.extend(item);
    out.extend(TokenStream::from(error.to_compile_error()));
    out
}
