use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "catalog", rw = "read", permits = 4)]
async fn both() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
