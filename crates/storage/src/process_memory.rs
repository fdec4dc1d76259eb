//! How much memory this process may use: the machine's RAM, or its memory cgroup's limit
//! when that is lower (a container, a systemd unit, the bench's memory caps).
//!
//! Why: the segment tails size their memory from it (`segment_tail::tail_memory_bytes_max`).
//! A broker that sized them from the machine's RAM alone would be killed by its cgroup's
//! limit long before the RAM ran out.

use std::path::Path;

/// Bytes of RAM, or of the tightest memory cgroup limit on the way to the root when lower.
pub(crate) fn usable_memory_bytes() -> usize {
    let physical = physical_memory_bytes();
    cgroup_limit_bytes().map_or(physical, |limit| limit.min(physical))
}

fn physical_memory_bytes() -> usize {
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
    let (pages, page_bytes) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages <= 0 || page_bytes <= 0 {
        return usize::MAX;
    }
    (pages as usize).saturating_mul(page_bytes as usize)
}

/// The limit of this process's memory cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`),
/// the lowest along its path to the root; `None` when unlimited or not found.
fn cgroup_limit_bytes() -> Option<usize> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    membership.lines().filter_map(lowest_limit_on_path).min()
}

/// One line of `/proc/self/cgroup` (`id:controllers:path`): the lowest limit of the memory
/// controller's cgroups from the path up.
fn lowest_limit_on_path(line: &str) -> Option<usize> {
    let mut fields = line.splitn(3, ':');
    let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
    let (root, limit_file) = match controllers {
        "" => ("/sys/fs/cgroup", "memory.max"),
        c if c.split(',').any(|c| c == "memory") => ("/sys/fs/cgroup/memory", "memory.limit_in_bytes"),
        _ => return None,
    };
    let mut dir = Path::new(root).join(path.trim_start_matches('/'));
    let mut lowest: Option<usize> = None;
    while dir.starts_with(root) {
        let limit = std::fs::read_to_string(dir.join(limit_file)).ok().and_then(|text| text.trim().parse().ok());
        lowest = match (lowest, limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if !dir.pop() {
            break;
        }
    }
    lowest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usable_memory_is_some_and_at_most_the_ram() {
        let usable = usable_memory_bytes();
        assert!(usable > 0 && usable <= physical_memory_bytes());
    }

    #[test]
    fn lines_of_other_controllers_have_no_limit() {
        assert_eq!(lowest_limit_on_path("4:cpu,cpuacct:/"), None);
        assert_eq!(lowest_limit_on_path("garbage"), None);
    }
}
