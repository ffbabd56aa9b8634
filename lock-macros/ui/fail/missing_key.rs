use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(ttl = "10s")]
async fn job() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock]
async fn bare() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
