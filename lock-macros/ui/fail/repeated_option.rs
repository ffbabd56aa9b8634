use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "job", ttl = "10s", ttl = "20s")]
async fn job() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
