use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "job")]
fn job() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let _ = job();
}
