use lock_runtime::distributed_lock;

#[distributed_lock(key = "job")]
struct Job;

fn main() {}
