//! Generic functions, `impl Trait` arguments, lifetimes, and `Send` futures
//! spawned on tokio.

use std::fmt::Display;
use std::sync::Arc;

use lock_runtime::{LockClient, LockError, distributed_lock};

#[distributed_lock(key = "item:<id>", client = client)]
async fn generic<K, E>(client: Arc<LockClient>, id: K) -> Result<String, E>
where
    K: Display + Send + Sync,
    E: From<LockError>,
{
    Ok(format!("item {id}"))
}

#[distributed_lock(key = "impl:<id>:<name>")]
async fn impl_trait(id: impl Display, name: impl AsRef<str> + Display) -> Result<usize, LockError> {
    Ok(name.as_ref().len() + id.to_string().len())
}

#[distributed_lock(key = "borrow:<text>")]
async fn borrowed<'a>(text: &'a str, out: &'a mut Vec<&'a str>) -> Result<&'a str, LockError> {
    out.push(text);
    Ok(text)
}

/// `impl Trait` in the return type: the expansion cannot name it, and need not.
#[distributed_lock(key = "display:<n>")]
async fn returns_impl(n: u8) -> Result<impl Display + Send, LockError> {
    Ok(n * 2)
}

struct Repo<T> {
    items: Vec<T>,
}

impl<T: Display + Clone + Send + Sync + 'static> Repo<T> {
    #[distributed_lock(key = "repo:<index>")]
    async fn get(&self, index: usize) -> Result<Option<T>, LockError> {
        Ok(self.items.get(index).cloned())
    }

    /// An elided lifetime in the return type.
    #[distributed_lock(key = "repo:first")]
    async fn first(&self) -> Result<Option<&T>, LockError> {
        Ok(self.items.first())
    }

    /// `Self` in the return type.
    #[distributed_lock(key = "repo:new")]
    async fn new(items: Vec<T>) -> Result<Self, LockError> {
        Ok(Self { items })
    }
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::test(flavor = "multi_thread")]
async fn every_form_runs() {
    let client = LockClient::builder().memory().build().await.unwrap();
    lock_runtime::set_global_client(client.clone());

    let fut = generic::<_, LockError>(Arc::new(client.clone()), 5u8);
    assert_send(&fut);
    assert_eq!(tokio::spawn(fut).await.unwrap().unwrap(), "item 5");

    let fut = impl_trait(12, "ab");
    assert_send(&fut);
    assert_eq!(tokio::spawn(fut).await.unwrap().unwrap(), 4);

    let mut out = Vec::new();
    assert_eq!(borrowed("x", &mut out).await.unwrap(), "x");

    assert_eq!(returns_impl(21).await.unwrap().to_string(), "42");

    let repo = Arc::new(Repo::new(vec![String::from("a")]).await.unwrap());
    assert_eq!(repo.first().await.unwrap().map(String::as_str), Some("a"));
    let task = tokio::spawn({
        let repo = repo.clone();
        async move { repo.get(0).await }
    });
    assert_eq!(task.await.unwrap().unwrap().as_deref(), Some("a"));
}
