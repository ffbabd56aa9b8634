//! Sentinel groups of different runs share the loopback: another worktree's
//! `fault` run or tests, or the processes of a run that was killed before it
//! could clean up. Sentinels know instances by address, so a group that
//! still knows a port talks to whatever a new run starts there. With one
//! master name for every group, the new group's sentinels adopted the old
//! sentinels as peers and, their configuration epoch being higher after a
//! failover, switched the master to the old group's server: fencing
//! counters from another run, and tokens issued twice (658 violations in one
//! `fault all` run). Each group now has a master name of its own and a
//! `SLAVEOF` only its sentinels can call.

use std::time::Duration;

use fault::server::SentinelGroup;

#[test]
fn a_sentinel_group_that_still_knows_a_port_stays_out_of_the_group_started_on_it() {
    let mut old = SentinelGroup::start().expect("the old group");
    // The old group loses its replica; its sentinels keep calling the port.
    let port = old.servers[1].port;
    old.servers[1].kill();
    let new = SentinelGroup::start_with_replica_on(port).expect("the new group");
    // Sentinels reconnect every second and say hello every 2 s.
    std::thread::sleep(Duration::from_secs(5));
    new.check_isolated()
        .expect("the old group's sentinels joined the new group");
    assert_eq!(new.master_index(), Some(0));
}
