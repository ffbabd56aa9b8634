use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "order:<id")]
async fn unclosed(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "order:< id >")]
async fn spaces(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "")]
async fn empty() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
