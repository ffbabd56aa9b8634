use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(keys = "account:<from>")]
async fn not_a_list(from: u64) -> Result<(), LockError> {
    let _ = from;
    Ok(())
}

#[distributed_lock(keys = ["account:<from>", 7])]
async fn not_a_string(from: u64) -> Result<(), LockError> {
    let _ = from;
    Ok(())
}

fn main() {}
