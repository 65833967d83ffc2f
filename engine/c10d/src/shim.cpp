// extern "C" shim over libtorch's own c10d: TCPStore (the rendezvous), PrefixStore (one group's
// keys) and ProcessGroupGloo (collectives on CPU tensors). The Rust side (src/ffi.rs, src/lib.rs)
// is the only caller.
//
// Conventions: every function that can fail returns NULL on success or a malloc'ed, NUL-terminated
// message the caller frees with miles_c10d_free; no C++ exception crosses this boundary. Tensors
// arrive as tch's `C_tensor*`, which is `at::Tensor*` (torch-sys's torch_api.h:
// `typedef torch::Tensor *tensor;`). Strings arrive as (pointer, length): a Rust &str is not
// NUL-terminated.

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <c10/util/Exception.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Store {
  c10::intrusive_ptr<c10d::Store> store;
  uint16_t port;
};

struct Group {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  std::chrono::milliseconds timeout;
};

char* message(const std::string& text) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (out == nullptr) {
    std::abort();  // NULL means success to the caller; a message that cannot be allocated cannot be told
  }
  std::memcpy(out, text.data(), text.size());
  out[text.size()] = '\0';
  return out;
}

// c10::Error's what() carries a C++ backtrace of libtorch's frames; the message alone is what a
// user can act on.
template <typename F>
char* guarded(F&& body) {
  try {
    body();
    return nullptr;
  } catch (const c10::Error& e) {
    return message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return message(e.what());
  } catch (...) {
    return message("unknown C++ exception in c10d");
  }
}

std::string str(const char* ptr, size_t len) {
  return std::string(ptr, len);
}

// Gloo reads and writes numel() elements from data_ptr(): a strided view (every other element)
// passes c10d's own checks and is silently reduced over the wrong elements, so the shim refuses
// anything but a contiguous CPU tensor.
const at::Tensor& checked(const at::Tensor& t, const char* role, size_t i) {
  auto where = [&] { return std::string(role) + " " + std::to_string(i); };
  if (!t.defined()) {
    throw std::invalid_argument(where() + " is an undefined tensor");
  }
  if (!t.device().is_cpu()) {
    throw std::invalid_argument(where() + " is on " + t.device().str() +
                                ": the Gloo group takes CPU tensors");
  }
  if (t.is_sparse() || !t.is_contiguous()) {
    std::ostringstream shape;
    shape << "sizes " << t.sizes() << ", strides " << t.strides();
    throw std::invalid_argument(where() + " is not contiguous (" + shape.str() +
                                "): pass .contiguous() and copy the result back");
  }
  return t;
}

std::vector<at::Tensor> tensors(at::Tensor* const* ts, size_t n, const char* role) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    // Shares the storage: in-place results land in the caller's tensor.
    out.push_back(checked(*ts[i], role, i));
  }
  return out;
}

std::string seconds(std::chrono::milliseconds d) {
  std::ostringstream out;
  out << static_cast<double>(d.count()) / 1000.0 << " s";
  return out.str();
}

void wait(const c10::intrusive_ptr<c10d::Work>& work, std::chrono::milliseconds timeout) {
  try {
    // Rethrows the collective's own exception (a closed peer connection, gloo's own timeout).
    work->wait(timeout);
  } catch (const std::exception& e) {
    // Work::wait's own timeout says only "Operation timed out!"; gloo's (the same bound, on its
    // worker thread, whichever fires first: a gloo::IoException, not a c10::Error) names a
    // buffer operation. Both mean the same here.
    auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    const char* text = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
    if (work->isCompleted() && std::strstr(text, "Timed out") == nullptr) {
      throw;
    }
    throw std::runtime_error("no answer within " + seconds(timeout) +
                             ": a rank did not take part (stopped, stuck, or calling a different "
                             "collective)");
  }
}

c10d::ReduceOp reduce_op(int op) {
  switch (op) {
    case 0:
      return c10d::ReduceOp::SUM;
    case 1:
      return c10d::ReduceOp::MAX;
    case 2:
      return c10d::ReduceOp::MIN;
    default:
      throw std::invalid_argument("unknown reduce op " + std::to_string(op));
  }
}

}  // namespace

extern "C" {

void miles_c10d_free(void* ptr) {
  std::free(ptr);
}

// The tensors' fitness for a Gloo collective (see `checked`), before any rank sends a byte: a
// refusal here leaves the group in step, unlike a collective that failed part-way.
char* miles_c10d_check_tensors(at::Tensor* const* ts, size_t n, const char* role, size_t role_len) {
  return guarded([&] { tensors(ts, n, str(role, role_len).c_str()); });
}

// A TCPStore server (is_server != 0; port 0 binds a free port, read back with
// miles_c10d_store_port) or a client that retries its connection for up to timeout_ms. The store's
// timeout also bounds every get and wait.
char* miles_c10d_store_new(const char* host, size_t host_len, uint16_t port, int is_server,
                           int64_t timeout_ms, Store** out) {
  *out = nullptr;
  return guarded([&] {
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = is_server != 0;
    // The number of clients is not known to the store: ranks join through their own keys
    // (miles_c10d_group_gloo), which names the ones that never came.
    opts.numWorkers = std::nullopt;
    opts.waitWorkers = false;
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    auto store = c10::make_intrusive<c10d::TCPStore>(str(host, host_len), opts);
    uint16_t bound = store->getPort();
    *out = new Store{std::move(store), bound};
  });
}

uint16_t miles_c10d_store_port(const Store* store) {
  return store->port;
}

void miles_c10d_store_free(Store* store) {
  delete store;
}

char* miles_c10d_store_set(Store* store, const char* key, size_t key_len, const uint8_t* value,
                           size_t value_len) {
  return guarded([&] {
    std::vector<uint8_t> bytes(value, value + value_len);
    store->store->set(str(key, key_len), bytes);
  });
}

// *value is malloc'ed (freed with miles_c10d_free); an empty value may come back as NULL.
char* miles_c10d_store_get(Store* store, const char* key, size_t key_len, uint8_t** value,
                           size_t* value_len) {
  *value = nullptr;
  *value_len = 0;
  return guarded([&] {
    std::vector<uint8_t> bytes = store->store->get(str(key, key_len));
    if (bytes.empty()) {
      return;
    }
    auto* buf = static_cast<uint8_t*>(std::malloc(bytes.size()));
    if (buf == nullptr) {
      throw std::bad_alloc();
    }
    std::memcpy(buf, bytes.data(), bytes.size());
    *value = buf;
    *value_len = bytes.size();
  });
}

// Joins the Gloo group `prefix` as `rank` of `world`. Each rank first sets `<prefix>/joined/<rank>`
// and waits for every rank's key: ProcessGroupGloo's constructor would also block until all ranks
// connect, but its timeout does not say who is missing. When the wait times out, the ranks whose
// keys are absent are written to missing[0..*missing_len] (missing has room for `world`) and no
// group is made (*out stays NULL, the return is NULL too: the caller words the error).
//
// device_kind: 0 the default device (this host's name, else loopback), 1 the interface named by
// device_name, 2 the hostname or address named by device_name.
char* miles_c10d_group_gloo(Store* store, const char* prefix, size_t prefix_len, int rank,
                            int world, int64_t timeout_ms, int device_kind,
                            const char* device_name, size_t device_name_len, int64_t* missing,
                            size_t* missing_len, Group** out) {
  *out = nullptr;
  *missing_len = 0;
  return guarded([&] {
    auto timeout = std::chrono::milliseconds(timeout_ms);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(str(prefix, prefix_len), store->store);
    std::vector<std::string> keys;
    keys.reserve(world);
    for (int r = 0; r < world; ++r) {
      keys.push_back("joined/" + std::to_string(r));
    }
    prefixed->set(keys[rank], std::vector<uint8_t>{1});
    try {
      prefixed->wait(keys, timeout);
    } catch (const c10::Error& wait_error) {
      // A timeout: find out who never came. If the store itself is gone, report its error.
      for (int r = 0; r < world; ++r) {
        if (!prefixed->check({keys[r]})) {
          missing[(*missing_len)++] = r;
        }
      }
      if (*missing_len > 0) {
        return;
      }
      throw;
    }

    std::shared_ptr<::gloo::transport::Device> device;
    std::string name = str(device_name, device_name_len);
    switch (device_kind) {
      case 1:
        device = c10d::ProcessGroupGloo::createDeviceForInterface(name);
        break;
      case 2:
        device = c10d::ProcessGroupGloo::createDeviceForHostname(name);
        break;
      default:
        device = c10d::ProcessGroupGloo::createDefaultDevice();
        break;
    }
    // libtorch's flight recorder is one per process, and recording into it from several groups
    // at once crashed (std::map insert in FlightRecorder::recordWithResetEnabled: ranks as threads,
    // about 1 run in 20); miles never reads its dumps. Off unless the user asked for it.
    setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0);
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(std::move(device));
    // The constructor connects the full mesh (bounded by options->timeout) and starts the
    // worker threads that run the queued collectives (two by default: two buckets in flight).
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, world, options);
    *out = new Group{std::move(pg), timeout};
  });
}

// Waits for queued collectives to finish (each bounded by gloo's timeout), then closes the
// connections: a peer still waiting on this rank then fails at once instead of at its timeout.
void miles_c10d_group_free(Group* group) {
  try {
    delete group;
  } catch (...) {
    // A destructor that throws (it should not): nothing to report to, and unwinding into Rust is
    // undefined behaviour.
  }
}

// In place, every tensor of ts. All reductions are queued first and then waited for, so the
// group's worker threads run several at once.
char* miles_c10d_all_reduce(Group* group, at::Tensor* const* ts, size_t n, int op) {
  return guarded([&] {
    c10d::AllreduceOptions opts;
    opts.reduceOp = reduce_op(op);
    opts.timeout = group->timeout;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    works.reserve(n);
    std::vector<std::vector<at::Tensor>> args;
    args.reserve(n);  // allreduce takes its argument by reference: keep each alive and in place
    for (size_t i = 0; i < n; ++i) {
      args.push_back({checked(*ts[i], "tensor", i)});  // all checked before any is sent
    }
    for (auto& arg : args) {
      works.push_back(group->pg->allreduce(arg, opts));
    }
    // Wait for every one even after a failure, so that none is still writing into a caller's
    // tensor when this returns; the first failure is the one reported.
    std::exception_ptr first;
    for (auto& work : works) {
      try {
        wait(work, group->timeout);
      } catch (...) {
        if (!first) {
          first = std::current_exception();
        }
      }
    }
    if (first) {
      std::rethrow_exception(first);
    }
  });
}

char* miles_c10d_broadcast(Group* group, at::Tensor* t, int root) {
  return guarded([&] {
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.rootTensor = 0;
    opts.timeout = group->timeout;
    std::vector<at::Tensor> args{checked(*t, "tensor", 0)};
    wait(group->pg->broadcast(args, opts), group->timeout);
  });
}

// out[r] becomes rank r's input.
char* miles_c10d_all_gather(Group* group, at::Tensor* const* out, size_t n, at::Tensor* input) {
  return guarded([&] {
    c10d::AllgatherOptions opts;
    opts.timeout = group->timeout;
    std::vector<std::vector<at::Tensor>> outputs{tensors(out, n, "output")};
    std::vector<at::Tensor> inputs{checked(*input, "input", 0)};
    wait(group->pg->allgather(outputs, inputs, opts), group->timeout);
  });
}

// out becomes the sum over ranks of their inputs[rank].
char* miles_c10d_reduce_scatter(Group* group, at::Tensor* out, at::Tensor* const* inputs,
                                size_t n) {
  return guarded([&] {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    opts.timeout = group->timeout;
    std::vector<at::Tensor> outputs{checked(*out, "output", 0)};
    std::vector<std::vector<at::Tensor>> ins{tensors(inputs, n, "input")};
    wait(group->pg->reduce_scatter(outputs, ins, opts), group->timeout);
  });
}

// Rank 0 waits up to the timeout for every other rank to check in and names every one that did
// not (c10d's monitoredBarrier with waitAllRanks); the other ranks wait for rank 0's answer.
char* miles_c10d_monitored_barrier(Group* group) {
  return guarded([&] {
    c10d::BarrierOptions opts;
    opts.timeout = group->timeout;
    group->pg->monitoredBarrier(opts, /*waitAllRanks=*/true);
  });
}

char* miles_c10d_barrier(Group* group) {
  return guarded([&] {
    c10d::BarrierOptions opts;
    opts.timeout = group->timeout;
    wait(group->pg->barrier(opts), group->timeout);
  });
}

}  // extern "C"
