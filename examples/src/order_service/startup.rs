//! The order service's settings (environment variables) and its startup
//! errors: one readable line with the whole error chain, then exit code 1.

use std::error::Error;
use std::fmt;
use std::time::Duration;

/// A startup failure: what was being done, and the error that stopped it.
#[derive(Debug)]
pub struct Startup {
    doing: String,
    source: Option<Box<dyn Error + Send + Sync>>,
}

impl Startup {
    pub fn new(doing: impl Into<String>) -> Self {
        Startup {
            doing: doing.into(),
            source: None,
        }
    }

    pub fn because(doing: impl Into<String>, source: impl Error + Send + Sync + 'static) -> Self {
        Startup {
            doing: doing.into(),
            source: Some(Box::new(source)),
        }
    }
}

impl fmt::Display for Startup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.doing)
    }
}

impl Error for Startup {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// `error: cause: cause ...`, on one line. A cause whose text the message
/// already shows (many errors print their source in their own message) is
/// left out.
pub fn report(error: &dyn Error) -> String {
    let mut out = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

/// What the environment asks for.
#[derive(Debug)]
pub struct Settings {
    /// `REDIS_URL`: locks, idempotency records and orders on this Redis;
    /// unset: all in this process.
    pub redis_url: Option<String>,
    /// `DATABASE_URL`: orders in this PostgreSQL database (locks and
    /// idempotency records stay where `REDIS_URL` says).
    pub database_url: Option<String>,
    /// `NAMESPACE` (default `orders`): every Redis name starts with
    /// `<namespace>:`. Instances that share one share orders.
    pub namespace: String,
    /// `PORT` (default 3000), on 127.0.0.1.
    pub port: u16,
    /// `PAYMENT_DELAY_MS` (default 1000): how long the fake payment provider takes.
    pub payment_delay: Duration,
    /// `CANCEL_UNPAID_AFTER_MS` (default 15 minutes): the sweeper cancels
    /// orders left unpaid longer.
    pub cancel_unpaid_after: Duration,
    /// `SWEEP_EVERY_MS` (default 5000): between the sweeper's sweeps.
    pub sweep_every: Duration,
    /// `IDEMPOTENCY_COMMIT` (`on` by default, or `off`): whether a new order
    /// commits with its idempotency record. `off` is the weaker guarantee
    /// (the order, then the record: a crash between them lets a retry create
    /// a second order), kept to measure what the commit prevents.
    pub idempotency_commit: bool,
    /// `IDEMPOTENCY_LEASE_MS` (default: the client's TTL, 30 s): how long a
    /// creation's key stays in flight after its instance died.
    pub idempotency_lease: Option<Duration>,
}

impl Settings {
    pub fn from_env() -> Result<Self, Startup> {
        let namespace = var("NAMESPACE")?.unwrap_or_else(|| "orders".to_owned());
        if namespace.is_empty()
            || !namespace
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(Startup::new(format!(
                "cannot start: NAMESPACE={namespace:?} is not usable: use letters, digits, `-`, `_` and `.`"
            )));
        }
        Ok(Settings {
            redis_url: var("REDIS_URL")?,
            database_url: var("DATABASE_URL")?,
            namespace,
            port: number("PORT", 3000)?,
            payment_delay: Duration::from_millis(number("PAYMENT_DELAY_MS", 1000)?),
            cancel_unpaid_after: Duration::from_millis(number("CANCEL_UNPAID_AFTER_MS", 900_000)?),
            sweep_every: Duration::from_millis(number("SWEEP_EVERY_MS", 5000)?.max(1)),
            idempotency_lease: match var("IDEMPOTENCY_LEASE_MS")? {
                Some(_) => Some(Duration::from_millis(number("IDEMPOTENCY_LEASE_MS", 0)?)),
                None => None,
            },
            idempotency_commit: match var("IDEMPOTENCY_COMMIT")?.as_deref() {
                None | Some("on") => true,
                Some("off") => false,
                Some(other) => {
                    return Err(Startup::new(format!(
                        "cannot start: IDEMPOTENCY_COMMIT={other:?} is not usable: use `on` or `off`"
                    )));
                }
            },
        })
    }
}

fn var(name: &str) -> Result<Option<String>, Startup> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => Err(Startup::because(
            format!("cannot start: {name} is not usable"),
            e,
        )),
    }
}

fn number<T: std::str::FromStr>(name: &str, default: T) -> Result<T, Startup>
where
    T::Err: Error + Send + Sync + 'static,
{
    match var(name)? {
        Some(v) => v
            .parse()
            .map_err(|e| Startup::because(format!("cannot start: {name}={v:?} is not usable"), e)),
        None => Ok(default),
    }
}

/// `url` without its password, for messages and logs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            let password = if userinfo.contains(':') { ":***" } else { "" };
            format!(
                "{scheme}://{user}{password}@{host}{}",
                &rest[authority_end..]
            )
        }
        None => url.to_owned(),
    }
}
