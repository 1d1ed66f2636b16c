// Word-level atomic access and the seqlock protocol for control-block memory.
//
// Control-block memory is shared with another process that may write it at any time, so it
// is touched only through these helpers: plain loads/stores of changing shared memory are
// data races, and memcpy from it is one too.
//
//   // writer (single per seqlocked record)
//   uint64_t s = SeqWriteBegin(&entry->seq);
//   StoreRelaxed(&entry->state, ...);
//   SeqWriteEnd(&entry->seq, s);
//   // reader (any number)
//   RingEntry copy;
//   bool ok = SeqReadCopy(&shared->seq, shared, &copy, sizeof copy, /*max_tries=*/64);
//
// Thread-safety: all functions are safe to call concurrently; the seqlock gives readers a
// consistent copy as long as each record has a single writer.
#ifndef COMMD_COMMON_CONTROL_BLOCK_ATOMIC_H_
#define COMMD_COMMON_CONTROL_BLOCK_ATOMIC_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace commd::cb_atomic {

// An 8-byte word that may alias any object (the ABI groups byte arrays into words).
typedef uint64_t __attribute__((may_alias)) AliasedWord;

template <typename T>
inline T LoadRelaxed(const T* p) {
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
template <typename T>
inline T LoadAcquire(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <typename T>
inline void StoreRelaxed(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
template <typename T>
inline void StoreRelease(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

// Stores the 8 bytes at `word` (8-byte aligned) as one relaxed atomic word.
inline void StoreWordRelaxed(void* word, uint64_t v) {
  __atomic_store_n(static_cast<AliasedWord*>(word), v, __ATOMIC_RELAXED);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Marks the record as being written (odd) and returns the value to pass to SeqWriteEnd.
// Only the record's single writer may call it; the previous value must be even.
inline uint64_t SeqWriteBegin(uint64_t* seq) {
  uint64_t s = LoadRelaxed(seq) & ~uint64_t{1};
  StoreRelaxed(seq, s + 1);
  // Orders the odd marker before the data stores that follow (Boehm, "Can seqlocks get
  // along with programming language memory models?").
  std::atomic_thread_fence(std::memory_order_release);
  return s;
}
inline void SeqWriteEnd(uint64_t* seq, uint64_t begun) { StoreRelease(seq, begun + 2); }

// Copies `bytes` (a multiple of 8, 8-byte aligned source and destination) with relaxed
// 8-byte atomic loads.
inline void CopyWordsRelaxed(const void* src, void* dst, size_t bytes) {
  const AliasedWord* s = static_cast<const AliasedWord*>(src);
  AliasedWord* d = static_cast<AliasedWord*>(dst);
  for (size_t i = 0; i < bytes / 8; ++i) d[i] = __atomic_load_n(s + i, __ATOMIC_RELAXED);
}

// Copies a seqlocked record of `bytes` starting at `src` (whose first word is the seq).
// Returns false when the record was still changing after `max_tries` attempts (a writer
// stuck or killed mid-write leaves it odd forever). Never blocks beyond that bound.
// `*tries_used` (optional) gets the attempts made.
inline bool SeqReadCopy(const void* src, void* dst, size_t bytes, int max_tries,
                        int* tries_used = nullptr) {
  const AliasedWord* seq = static_cast<const AliasedWord*>(src);
  for (int attempt = 0; attempt < max_tries; ++attempt) {
    if (tries_used != nullptr) *tries_used = attempt + 1;
    uint64_t s1 = LoadAcquire(seq);
    if ((s1 & 1) == 0) {
      CopyWordsRelaxed(src, dst, bytes);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (LoadRelaxed(seq) == s1) return true;
    }
    CpuRelax();
  }
  return false;
}

}  // namespace commd::cb_atomic

#endif  // COMMD_COMMON_CONTROL_BLOCK_ATOMIC_H_
