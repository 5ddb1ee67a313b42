//! UD queue pairs, address handles and multicast.
use rdma_sys::ibv_context_ops;
/// Largest number of QPs per context.
pub const MAX_QP: u32 = 4096;
/// Largest work queue.
pub const MAX_QP_WR: u32 = 16384;
/// Largest scatter/gather list.
pub const MAX_SGE: u32 = 16;
/// Installs the QP entry points in a context's ops table.
pub fn fill_ops(_ops: &mut ibv_context_ops) {}
