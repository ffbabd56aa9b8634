use lock_runtime::distributed_lock;

#[distributed_lock(key = "job")]
async fn number() -> u32 {
    1
}

#[distributed_lock(key = "job")]
async fn nothing() {}

#[derive(Debug)]
struct NoFrom;

#[distributed_lock(key = "job")]
async fn error_without_from() -> Result<(), NoFrom> {
    Ok(())
}

#[distributed_lock(key = "job")]
async fn tuple() -> (u32, u32) {
    (1, 2)
}

fn main() {}
