// The attribute keeps `unsafe`: a call still needs an `unsafe` block.
use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "unsafe")]
async unsafe fn unsafe_fn(p: *const u8) -> Result<bool, LockError> {
    Ok(p.is_null())
}

async fn caller() -> Result<bool, LockError> {
    unsafe_fn(std::ptr::null()).await
}

fn main() {
    let _ = caller;
}
