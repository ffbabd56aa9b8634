use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "catalog:<id>", rw = "shared")]
async fn unknown_side(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "catalog:<id>", rw = true)]
async fn not_a_string(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
