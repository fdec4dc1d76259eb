//! A global allocator that keeps hostile length fields from aborting the broker.
//!
//! The `kafka-protocol` decoders size a `Vec` from the array length on the wire before
//! reading its elements (`Vec::with_capacity(n)`), so a 20-byte frame claiming 2^31
//! elements asks for hundreds of GiB, the allocation fails, and Rust aborts the process.
//! Decoding then fails a few bytes later on the short buffer, so the memory is never
//! touched. This allocator serves such huge requests with `mmap(MAP_NORESERVE)`: address
//! space only, no commitment, pages materialise only if written (which the frame size
//! bounds). Everything smaller goes to the system allocator unchanged.
//!
//! Install it in the binary: `#[global_allocator] static A: GuardedAllocator = GuardedAllocator;`

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations at least this large are reserved lazily with mmap. No legitimate
/// allocation of Sluice comes near it (requests are capped at 100 MiB by default).
pub const LAZY_ALLOCATION_BYTES_MIN: usize = 1 << 30;
const PAGE_BYTES: usize = 4096;

pub struct GuardedAllocator;

fn is_lazy(layout: Layout) -> bool {
    layout.size() >= LAZY_ALLOCATION_BYTES_MIN && layout.align() <= PAGE_BYTES
}

unsafe fn map_lazily(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping has no preconditions; failure returns MAP_FAILED.
    let pointer = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if pointer == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        pointer.cast()
    }
}

// SAFETY: every pointer is released by the same mechanism that produced it, chosen by the
// layout size, which GlobalAlloc guarantees is identical at alloc and dealloc.
unsafe impl GlobalAlloc for GuardedAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_lazy(layout) {
            return unsafe { map_lazily(layout.size()) };
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_lazy(layout) {
            // Anonymous mappings are zero-filled.
            return unsafe { map_lazily(layout.size()) };
        }
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        if is_lazy(layout) {
            unsafe { libc::munmap(pointer.cast(), layout.size()) };
            return;
        }
        unsafe { System.dealloc(pointer, layout) }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if !is_lazy(layout) && !is_lazy(new_layout) {
            return unsafe { System.realloc(pointer, layout, new_size) };
        }
        if is_lazy(layout) && is_lazy(new_layout) {
            // Move the mapping instead of copying (and so touching) its pages.
            let moved = unsafe { libc::mremap(pointer.cast(), layout.size(), new_size, libc::MREMAP_MAYMOVE) };
            return if moved == libc::MAP_FAILED { std::ptr::null_mut() } else { moved.cast() };
        }
        // One side is below the lazy threshold, so the copy is bounded by it.
        let new_pointer = unsafe { self.alloc(new_layout) };
        if !new_pointer.is_null() {
            unsafe {
                std::ptr::copy_nonoverlapping(pointer, new_pointer, layout.size().min(new_size));
                self.dealloc(pointer, layout);
            }
        }
        new_pointer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_allocations_are_lazy_and_usable() {
        let layout = Layout::from_size_align(200 << 30, 8).unwrap();
        unsafe {
            let pointer = GuardedAllocator.alloc(layout);
            assert!(!pointer.is_null(), "200 GiB of address space must be reservable");
            pointer.write(7);
            assert_eq!(pointer.read(), 7);
            let grown = GuardedAllocator.realloc(pointer, layout, 201 << 30);
            assert_eq!(grown.read(), 7);
            GuardedAllocator.dealloc(grown, Layout::from_size_align(201 << 30, 8).unwrap());
        }
        let small = Layout::from_size_align(64, 8).unwrap();
        unsafe {
            let pointer = GuardedAllocator.alloc(small);
            assert!(!pointer.is_null());
            GuardedAllocator.dealloc(pointer, small);
        }
    }
}
