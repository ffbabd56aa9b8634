use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(keys = [])]
async fn nothing() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
