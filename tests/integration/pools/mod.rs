//! Node pools (issue 24) with the `local` driver: each node a network
//! namespace with a veth pair and a real `flotilla agent` inside, dialing
//! the master from it. Faults come from the wrapper the master puts around
//! the real driver when its test hooks are on
//! (`POST /test-hooks/pools/{name}/faults`).
//!
//! Checked as an operator would: a request is served by launching real
//! agents that enroll with a join token bound to their node id and carry
//! the pool's labels, and a cluster placed by those labels runs in their
//! namespaces; a pool that cannot serve declines with its reason and the
//! next is tried, the request failing only when all have declined; a try
//! that fails (an error, an agent that never says hello) is unwound and
//! retried up to `launch_retries`, then the pool is unhealthy and nothing
//! of it is left; a master killed during a create adopts the resource it
//! finds by tag; leaked resources are deleted after two passes and the
//! grace, never another installation's nor an untagged one, never after a
//! failed listing; `min_ready` keeps a spare; a request at quota waits.

mod ec2;
mod launching;
mod placement;
mod support;
