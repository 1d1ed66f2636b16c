// Groups, symmetric buffers and persistent buffers: the SDK side of daemon-owned memory.
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/src/client_impl.h"
#include "client/src/cuda_collectives.h"
#include "client/src/group_state.h"
#include "client/src/recorder_impl.h"
#include "commd/commd.h"
#include "common/control_block.h"
#include "common/control_block_atomic.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace commd {

struct PersistentBuffer::State {
  v1::PersistentBuffer buffer;
  std::unique_ptr<Mapping> mapping;
};

namespace {

// The CUDA device a persistent buffer lives on (-1 for host memory), mapped there.
int CudaIndexOf(const v1::PersistentBuffer& buffer) {
  int index = -1;
  return std::sscanf(buffer.handle().device().c_str(), "cuda:%d", &index) == 1 ? index : -1;
}

// The backend that runs the group's collectives on its device; null for a CUDA group in an
// SDK built without CUDA (collectives then say so).
std::unique_ptr<CollectiveBackend> MakeBackend(const GroupOptions& options, void* block,
                                               size_t block_bytes) {
  if (!options.device.is_host()) return MakeCudaBackend(options.device.cuda_index());
  auto* base = static_cast<std::byte*>(block);
  if (block_bytes < sizeof(ControlBlockFixed)) return MakeHostBackend(nullptr, nullptr);
  return MakeHostBackend(reinterpret_cast<const uint32_t*>(base + kAbortOffset),
                         reinterpret_cast<uint64_t*>(base + kProgressOffset +
                                                     offsetof(ControlBlockProgress, heartbeat_ns)));
}

// A group spanning nodes: its collectives meet the other nodes through gloo on host memory
// (span_collectives.h), through NCCL on CUDA memory (cuda_span_collectives.h; null in an SDK
// built without CUDA). The join checked the control block's size.
SpanCollectives MakeSpan(const GroupOptions& options, const v1::JoinGroupResponse& joined,
                         const std::vector<NodeRanks>& layout, absl::Duration timeout, void* block,
                         const std::shared_ptr<Client::Impl>& client) {
  auto* base = static_cast<std::byte*>(block);
  const std::string group = joined.name();
  std::weak_ptr<Client::Impl> weak = client;
  SpanSetup setup{.group = group,
                  .formation = joined.layout().formation(),
                  .local_rank = joined.rank(),
                  .local_world_size = joined.world_size(),
                  .global_world_size = joined.global_world_size(),
                  .layout = layout,
                  .node_index = joined.layout().this_node(),
                  .store = client->store.get(),
                  .connect_wait = timeout,
                  .abort_word = reinterpret_cast<const uint32_t*>(base + kAbortOffset),
                  .heartbeat_ns = reinterpret_cast<uint64_t*>(
                      base + kProgressOffset + offsetof(ControlBlockProgress, heartbeat_ns)),
                  // The rank's own error keeps the whole reason.
                  .request_abort = [weak, group](const std::string& reason) {
                    if (auto c = weak.lock()) c->RequestAbort(group, reason);
                  }};
  if (options.device.is_host()) return MakeHostSpanCollectives(std::move(setup));
  return MakeCudaSpanCollectives(options.device.cuda_index(), std::move(setup));
}

// What the collectives borrow of this rank's mapped `buffer`, built once: see BufferViews.
void BuildViews(SymmetricBuffer& buffer, int rank, int world_size, BufferViews& v) {
  const int n = world_size;
  v.data.resize(n);
  v.pads.resize(n);
  for (int p = 0; p < n; ++p) {
    v.data[p] = static_cast<std::byte*>(buffer.peer(p));
    v.pads[p] = buffer.signal_pad(p);
  }
  v.host = kernels::HostCommView{.rank = rank,
                                 .world_size = n,
                                 .data = v.data.data(),
                                 .pads = v.pads.data(),
                                 .data_bytes = buffer.size(),
                                 .pad_slots = buffer.signal_pad_bytes() / sizeof(uint32_t)};
}

}  // namespace

absl::StatusOr<v1::ListGroupsResponse> Client::ListGroups() {
  v1::ListGroupsResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(
      impl_->groups->ListGroups(impl_->Context().get(), v1::ListGroupsRequest(), &response)));
  return response;
}

absl::StatusOr<std::unique_ptr<Group>> Client::JoinGroup(const GroupOptions& options) {
  return Join(impl_, options, *impl_->WaitingContext(options.timeout));
}

absl::StatusOr<std::unique_ptr<Group>> Client::Join(const std::shared_ptr<Impl>& impl,
                                                    const GroupOptions& options,
                                                    grpc::ClientContext& context) {
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("group timeout ", absl::FormatDuration(options.timeout), " must be positive"));
  }
  v1::JoinGroupRequest request;
  request.set_name(options.name);
  request.set_rank(options.rank);
  request.set_world_size(options.world_size);
  request.set_global_rank(options.global_rank);
  request.set_global_world_size(options.global_world_size);
  request.set_description(options.description);
  request.set_device(options.device.ToString());
  ASSIGN_OR_RETURN(*request.mutable_device_uuid(), CudaDeviceUuid(options.device.cuda_index()));
  request.set_timeout_ms(absl::ToInt64Milliseconds(options.timeout));
  // kDefault, kReport, kNotify, kTerminate map onto the proto enum's values 0 to 3.
  request.set_watchdog_policy(static_cast<v1::WatchdogPolicy>(options.watchdog_policy));
  // kDefault, kOff, kOn, kSampled and kDefault, kReport, kFail map onto the proto enums' values;
  // the daemon checks them (and the sample period).
  request.set_nan_check(static_cast<v1::NanCheck>(options.nan_check));
  request.set_nan_sample_period(options.nan_sample_period);
  request.set_nan_policy(static_cast<v1::NanPolicy>(options.nan_policy));
  auto state = std::make_unique<Group::State>();
  state->client = impl;
  state->options = options;
  state->timeout_ms = static_cast<uint64_t>(absl::ToInt64Milliseconds(options.timeout));
  RETURN_IF_ERROR(FromGrpcStatus(impl->groups->JoinGroup(&context, request, &state->joined)));
  for (const v1::NodeRanks& n : state->joined.layout().nodes()) {
    state->layout.push_back(NodeRanks{
        .node = n.node(), .global_ranks = {n.global_ranks().begin(), n.global_ranks().end()}});
  }
  for (const v1::Member& m : state->joined.members()) {
    state->peers.pids.push_back(m.pid());
    const bool self = static_cast<int>(state->peers.pidfds.size()) == state->joined.rank();
    state->peers.pidfds.emplace_back(
        self ? -1 : static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(m.pid()), 0)));
  }
  ASSIGN_OR_RETURN(auto maps, impl->MapBuffers({&state->joined.control_block()}, -1));
  state->control_block = std::move(maps[0]);
  // Fault the block's pages in now, writable: otherwise the ring's first pass takes a page
  // fault every few entries, which doubled the SDK's per-call cost over a group's first
  // ~10,000 collectives (docs/PERFORMANCE.md "Issue #17"). Best effort (Linux 5.14+); the
  // memory is the block the daemon already allocated and counted.
  ::madvise(state->control_block->data(), state->joined.control_block().mapped_bytes(),
            MADV_POPULATE_WRITE);
  auto recorder = std::make_unique<Recorder::Impl>();
  state->recorder_impl = recorder.get();
  ASSIGN_OR_RETURN(
      recorder->writer,
      RingWriter::Attach(state->control_block->data(), state->joined.control_block().mapped_bytes(),
                         {.pg_id = state->joined.group_id(),
                          .pg_name = state->joined.name(),
                          // The daemon's word: it fills in the default for an empty one.
                          .pg_desc = state->joined.description()}));
  recorder->block = state->control_block->data();
  recorder->block_bytes = state->joined.control_block().mapped_bytes();
  state->recorder = std::make_unique<Recorder>(std::move(recorder));
  if (state->joined.global_world_size() > state->joined.world_size()) {
    SpanCollectives span = MakeSpan(options, state->joined, state->layout, options.timeout,
                                    state->control_block->data(), impl);
    state->close_span = std::move(span.close);
    state->backend = std::move(span.backend);
  } else {
    state->backend = MakeBackend(options, state->control_block->data(),
                                 state->joined.control_block().mapped_bytes());
  }
  state->world_size = state->joined.world_size();
  // 0 from a daemon older than the field: a node-local group.
  state->global_world_size = std::max(state->joined.global_world_size(), state->world_size);
  // The watchdog diagnoses (and under notify aborts) a collective pending past the group's
  // timeout; the SDK's own limit is a backstop for when the daemon cannot act, so by default
  // it comes later.
  state->default_wait = options.timeout + options.timeout;
  PointToPointParent p2p{.client = impl,
                         .options = options,
                         .name = state->joined.name(),
                         .self = state->joined.rank(),
                         .ranks = state->global_world_size,
                         .global_rank = state->joined.members(state->joined.rank()).global_rank()};
  if (state->global_world_size > state->world_size) {
    p2p.self = p2p.global_rank;  // a spanning group's ranks are its global ranks
    p2p.node_of.resize(state->global_world_size, -1);
    for (size_t n = 0; n < state->layout.size(); ++n) {
      for (int g : state->layout[n].global_ranks) p2p.node_of.at(g) = static_cast<int>(n);
    }
  }
  state->p2p = std::make_unique<PointToPointChannels>(std::move(p2p));
  Group::State* raw = state.get();
  state->hook = [raw](const std::string& reason) {
    // First end a wait on another node and the point-to-point messages in flight, then the
    // user's callback (which may take its time).
    if (raw->close_span) raw->close_span();
    const std::string why = raw->AbortReason();
    raw->p2p->Abort(why.empty() ? reason : why);
    raw->RunCallbackOnce(reason);
  };
  {
    absl::MutexLock lock(&impl->abort_mu);
    impl->abort_hooks.emplace(state->joined.name(), &state->hook);
  }
  return std::unique_ptr<Group>(new Group(std::move(state)));
}

std::string PeerProcesses::Exited() const {
  std::vector<std::string> gone;
  for (size_t r = 0; r < pidfds.size(); ++r) {
    if (pidfds[r].get() < 0) continue;
    pollfd p{pidfds[r].get(), POLLIN, 0};
    if (::poll(&p, 1, 0) == 1)
      gone.push_back(absl::StrCat("rank ", r, " (pid ", pids[r], ") exited"));
  }
  return absl::StrJoin(gone, ", ");
}

Group::Group(std::unique_ptr<State> state) : state_(std::move(state)) {
  State& s = *state_;
  s.entry_parts.emplace(CollectiveEntry::GroupParts{*this, *s.recorder_impl, s.joined.collectives(),
                                                    s.peers, s.timeout_ms});
}
Group::~Group() {
  {
    // First, so that no abort event reaches the backend while it goes.
    Client::Impl& client = *state_->client;
    absl::MutexLock lock(&client.abort_mu);
    auto [begin, end] = client.abort_hooks.equal_range(state_->joined.name());
    for (auto it = begin; it != end; ++it) {
      if (it->second == &state_->hook) {
        client.abort_hooks.erase(it);
        break;
      }
    }
  }
  state_->p2p.reset();  // ends this rank's channels and joins their threads
  state_->close_span = nullptr;
  state_->backend.reset();  // CUDA: waits for enqueued kernels before barrier_buffer_ is unmapped
}

bool Group::abort_requested() const {
  const auto* abort = reinterpret_cast<const ControlBlockAbort*>(
      static_cast<const char*>(state_->control_block->data()) + kAbortOffset);
  return cb_atomic::LoadAcquire(&abort->reason) != 0;
}

std::string Group::State::AbortReason() const {
  const auto* abort = reinterpret_cast<const ControlBlockAbort*>(
      static_cast<const char*>(control_block->data()) + kAbortOffset);
  const uint32_t reason = cb_atomic::LoadAcquire(&abort->reason);
  if (reason == 0) return "";
  // Written once, before the reason word: copied as words, as the ABI asks.
  char text[kAbortTextBytes];
  cb_atomic::CopyWordsRelaxed(abort->text, text, sizeof(text));
  text[sizeof(text) - 1] = '\0';
  return absl::StrCat(AbortReasonWords(reason), ": ", text);
}

std::string Group::abort_reason() const { return state_->AbortReason(); }

void Group::SetAbortCallback(std::function<void(const absl::Status&)> callback) {
  {
    absl::MutexLock lock(&state_->callback_mu);
    state_->callback = std::move(callback);
  }
  if (abort_requested()) state_->RunCallbackOnce(abort_reason());
}
int Group::rank() const { return state_->joined.rank(); }
int Group::world_size() const { return state_->world_size; }
int Group::global_rank() const { return state_->joined.members(rank()).global_rank(); }
int Group::global_world_size() const { return state_->global_world_size; }
const std::vector<NodeRanks>& Group::layout() const { return state_->layout; }
int Group::node_index() const {
  return state_->layout.empty() ? -1 : state_->joined.layout().this_node();
}
const std::string& Group::name() const { return state_->joined.name(); }
Device Group::device() const { return state_->options.device; }
const std::vector<int64_t>& Group::member_pids() const { return state_->peers.pids; }
Recorder& Group::recorder() { return *state_->recorder; }
absl::Duration Group::collective_timeout() const { return state_->options.timeout; }
bool Group::owns(const SymmetricBuffer& buffer) const {
  return buffer.state_->group_id == state_->joined.group_id() && buffer.state_->rank == rank();
}
void* Group::control_block() const { return state_->control_block->data(); }
size_t Group::control_block_bytes() const { return state_->joined.control_block().mapped_bytes(); }

absl::StatusOr<std::unique_ptr<SymmetricBuffer>> Group::AllocateSymmetric(size_t bytes) {
  return AllocateSymmetricOn(bytes, /*host_memory=*/false);
}

absl::StatusOr<std::unique_ptr<SymmetricBuffer>> Group::AllocateSymmetricOn(size_t bytes,
                                                                            bool host_memory) {
  v1::AllocateSymmetricRequest request;
  request.set_group_id(state_->joined.group_id());
  request.set_bytes(bytes);
  request.set_timeout_ms(absl::ToInt64Milliseconds(state_->options.timeout));
  request.set_host_memory(host_memory);
  auto buffer = std::make_unique<SymmetricBuffer::State>();
  buffer->client = state_->client;
  buffer->group_id = state_->joined.group_id();
  buffer->rank = rank();
  buffer->device = host_memory ? Device::Host() : state_->options.device;
  Client::Impl& client = *state_->client;
  RETURN_IF_ERROR(FromGrpcStatus(client.groups->AllocateSymmetric(
      client.WaitingContext(state_->options.timeout).get(), request, &buffer->allocation)));
  // Wrap before mapping, so a failure below still releases this rank's share.
  std::unique_ptr<SymmetricBuffer> out(new SymmetricBuffer(std::move(buffer)));
  SymmetricBuffer::State& s = *out->state_;
  std::vector<const v1::BufferHandle*> handles;
  for (const v1::BufferHandle& h : s.allocation.buffers()) handles.push_back(&h);
  ASSIGN_OR_RETURN(s.mappings, client.MapBuffers(handles, s.device.cuda_index()));
  BuildViews(*out, s.rank, static_cast<int>(s.mappings.size()), s.views);
  return out;
}

SymmetricBuffer::SymmetricBuffer(std::unique_ptr<State> state) : state_(std::move(state)) {}

SymmetricBuffer::~SymmetricBuffer() {
  state_->mappings.clear();
  v1::ReleaseSymmetricRequest request;
  request.set_group_id(state_->group_id);
  request.set_allocation_id(state_->allocation.allocation_id());
  v1::ReleaseSymmetricResponse response;
  // Best effort: if the daemon is gone, so is the memory; nothing is left to release.
  (void)state_->client->groups->ReleaseSymmetric(state_->client->Context().get(), request,
                                                 &response);
}

void* SymmetricBuffer::data() { return peer(state_->rank); }

void* SymmetricBuffer::peer(int rank) {
  if (rank < 0 || rank >= static_cast<int>(state_->mappings.size())) return nullptr;
  return static_cast<char*>(state_->mappings[rank]->data()) + state_->allocation.data_offset();
}

uint32_t* SymmetricBuffer::signal_pad(int rank) {
  if (rank < 0 || rank >= static_cast<int>(state_->mappings.size())) return nullptr;
  return static_cast<uint32_t*>(state_->mappings[rank]->data());
}

size_t SymmetricBuffer::signal_pad_bytes() const { return state_->allocation.signal_pad_bytes(); }
size_t SymmetricBuffer::size() const { return state_->allocation.bytes(); }
Device SymmetricBuffer::device() const { return state_->device; }
uint64_t SymmetricBuffer::id() const { return state_->allocation.allocation_id(); }

absl::StatusOr<std::unique_ptr<PersistentBuffer>> Client::AllocatePersistent(
    const std::string& name, size_t bytes, absl::Duration ttl, Device device) {
  v1::AllocatePersistentRequest request;
  request.set_name(name);
  request.set_bytes(bytes);
  request.set_device(device.ToString());
  ASSIGN_OR_RETURN(*request.mutable_device_uuid(), CudaDeviceUuid(device.cuda_index()));
  request.set_ttl_ms(absl::ToInt64Milliseconds(ttl));
  auto state = std::make_unique<PersistentBuffer::State>();
  RETURN_IF_ERROR(FromGrpcStatus(
      impl_->memory->AllocatePersistent(impl_->Context().get(), request, &state->buffer)));
  // Mapped on this process's device: the daemon's ordinal for it may differ.
  ASSIGN_OR_RETURN(auto maps, impl_->MapBuffers({&state->buffer.handle()}, device.cuda_index()));
  state->mapping = std::move(maps[0]);
  return std::unique_ptr<PersistentBuffer>(new PersistentBuffer(std::move(state)));
}

absl::StatusOr<std::unique_ptr<PersistentBuffer>> Client::AttachPersistent(
    const std::string& name) {
  v1::AttachPersistentRequest request;
  request.set_name(name);
  auto state = std::make_unique<PersistentBuffer::State>();
  RETURN_IF_ERROR(FromGrpcStatus(
      impl_->memory->AttachPersistent(impl_->Context().get(), request, &state->buffer)));
  // On the GPU with the buffer's UUID in this process's enumeration (the daemon's ordinal,
  // CudaIndexOf, may name another GPU here).
  ASSIGN_OR_RETURN(
      const int device,
      CudaOrdinalOfUuid(state->buffer.handle().device_uuid(), CudaIndexOf(state->buffer),
                        absl::StrCat("persistent buffer '", name, "'")));
  ASSIGN_OR_RETURN(auto maps, impl_->MapBuffers({&state->buffer.handle()}, device));
  state->mapping = std::move(maps[0]);
  return std::unique_ptr<PersistentBuffer>(new PersistentBuffer(std::move(state)));
}

absl::Status Client::DeletePersistent(const std::string& name) {
  v1::DeletePersistentRequest request;
  request.set_name(name);
  v1::DeletePersistentResponse response;
  return FromGrpcStatus(
      impl_->memory->DeletePersistent(impl_->Context().get(), request, &response));
}

PersistentBuffer::PersistentBuffer(std::unique_ptr<State> state) : state_(std::move(state)) {}
PersistentBuffer::~PersistentBuffer() = default;
void* PersistentBuffer::data() { return state_->mapping->data(); }
size_t PersistentBuffer::size() const { return state_->buffer.bytes(); }
const std::string& PersistentBuffer::name() const { return state_->buffer.name(); }

}  // namespace commd
