use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "job", timeout = "2s")]
async fn job() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
