// A recorded launch sequence (mla_dcp.ops.fast_launch.Sequence) replayed from C++.
//
// An eager step's host time under Python is mostly the interpreter between
// its launches: the plan lookup, one torch.empty per output, each launch's
// argument tuple parsed again by Triton's C launcher (with a driver query per
// pointer). A Plan holds everything the recorded call fixed: each source's
// layout (checked, never trusted), the outputs' and scratch buffer's sizes,
// and per launch the compiled kernel's CUfunction, grid, block, shared memory,
// launch attributes and every kernel parameter as a source's address, an
// offset into the scratch buffer, an encoded tensor map or constant bytes, in
// the order Triton's launcher passes them (mla_dcp/ops/native.py derives
// that order from the compiled kernel's signature). A call checks its sources
// against the recorded layouts, allocates from the allocator torch.empty
// used for the recorded outputs (the caching allocator, without at::empty's
// dispatch), and launches with cuLaunchKernelEx: one
// Python call a step instead of one per operation. Any mismatch, and any
// call under a dispatch or function mode or the profiler (they expect to see
// the ops), returns None, and the caller takes its Python path.

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <dlfcn.h>

#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda.h"

namespace py = pybind11;

namespace {

using LaunchKernelEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using GetErrorString = CUresult (*)(CUresult, const char**);
using CtxGetCurrent = CUresult (*)(CUcontext*);
using DeviceGet = CUresult (*)(CUdevice*, int);
using PrimaryCtxRetain = CUresult (*)(CUcontext*, CUdevice);
using CtxSetCurrent = CUresult (*)(CUcontext);

struct Driver {
  LaunchKernelEx launch = nullptr;
  GetErrorString error = nullptr;
  CtxGetCurrent ctx_get = nullptr;
  DeviceGet device_get = nullptr;
  PrimaryCtxRetain primary_retain = nullptr;
  CtxSetCurrent ctx_set = nullptr;
};

// The driver, opened on the first launch (the module loads where there is none, for the tests).
const Driver& driver() {
  static const Driver loaded = [] {
    Driver d;
    void* handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (handle == nullptr) return d;
    d.launch = reinterpret_cast<LaunchKernelEx>(dlsym(handle, "cuLaunchKernelEx"));
    d.error = reinterpret_cast<GetErrorString>(dlsym(handle, "cuGetErrorString"));
    d.ctx_get = reinterpret_cast<CtxGetCurrent>(dlsym(handle, "cuCtxGetCurrent"));
    d.device_get = reinterpret_cast<DeviceGet>(dlsym(handle, "cuDeviceGet"));
    d.primary_retain = reinterpret_cast<PrimaryCtxRetain>(dlsym(handle, "cuDevicePrimaryCtxRetain"));
    d.ctx_set = reinterpret_cast<CtxSetCurrent>(dlsym(handle, "cuCtxSetCurrent"));
    return d;
  }();
  return loaded;
}

void check(CUresult code, const char* what) {
  if (code == CUDA_SUCCESS) return;
  const char* text = "unknown error";
  if (driver().error != nullptr) driver().error(code, &text);
  throw std::runtime_error(std::string("mla_dcp native launch: ") + what + ": " + text);
}

// Triton's PyCUtensorMap object: the map follows the object header, 128-byte aligned.
struct PyTensorMap {
  PyObject_HEAD alignas(128) CUtensorMap map;
};

enum Kind : int { kSource = 0, kScratch = 1, kConstant = 2, kDescriptor = 3 };

struct Param {
  int kind;
  int size;        // bytes the kernel takes (descriptors: 128)
  int64_t index;   // source index, scratch offset or descriptor index
  uint64_t bits;   // a constant's little-endian bytes
};

struct LaunchSpec {
  CUfunction function;
  unsigned grid[3];
  unsigned threads;
  unsigned shared;
  bool pdl;
  bool cooperative;
  std::vector<Param> params;
};

struct SourceSpec {
  bool present;
  at::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
  bool aligned;
};

struct OutputSpec {
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
  int64_t offset;   // in bytes, into the block all outputs of a call share
};

// Each output's start in the shared block (as the caching allocator aligns a block's start).
constexpr int64_t kOutputAlignment = 512;
enum Allocation { kEmpty = 0, kDirect = 1, kOneBlock = 2 };

struct Descriptor {
  int64_t source;
  py::object encode;   // encode(tensor) -> Triton's PyCUtensorMap, or 128 bytes
  std::unordered_map<uint64_t, std::unique_ptr<CUtensorMap>> maps;   // by base address
};

// Encoded maps kept per descriptor (a layer's cache each, say) before they are dropped.
constexpr size_t kMaxMaps = 256;

class Plan {
 public:
  Plan(py::sequence sources, int64_t inputs, int64_t scratch_bytes)
      : inputs_(inputs), scratch_bytes_(scratch_bytes), device_(at::kCPU) {
    bool first = true;
    for (size_t i = 0; i < py::len(sources); ++i) {
      py::handle item = sources[i];
      SourceSpec spec{false, at::kByte, {}, {}, false};
      if (!item.is_none()) {
        if (!THPVariable_Check(item.ptr())) throw std::invalid_argument("a source is neither a tensor nor None");
        const at::Tensor& t = THPVariable_Unpack(item.ptr());
        spec = SourceSpec{true, t.scalar_type(), t.sizes().vec(), t.strides().vec(),
                          (reinterpret_cast<uintptr_t>(t.data_ptr()) & 15) == 0};
        if (first) device_ = t.device();
        first = false;
        if (static_cast<int64_t>(i) >= inputs_) {
          outputs_.push_back(OutputSpec{t.sizes().vec(), t.scalar_type(), block_bytes_});
          int64_t bytes = static_cast<int64_t>(t.numel() * t.element_size());
          block_bytes_ += (bytes + kOutputAlignment - 1) / kOutputAlignment * kOutputAlignment;
          // The allocator torch.empty gave the outputs (the caching allocator, or the one the
          // process installed in its place): later outputs come from it directly.
          if (allocator_ == nullptr && t.has_storage() && t.device() == device_) allocator_ = t.storage().allocator();
        }
      } else if (static_cast<int64_t>(i) >= inputs_) {
        throw std::invalid_argument("an output is None");
      }
      sources_.push_back(std::move(spec));
    }
    keys_ = c10::DispatchKeySet(c10::computeDispatchKey(std::nullopt, at::kStrided, device_));
  }

  void add_launch(uint64_t function, std::array<unsigned, 3> grid, unsigned threads, unsigned shared, bool pdl,
                  bool cooperative, const std::vector<std::array<int64_t, 3>>& params) {
    LaunchSpec spec{reinterpret_cast<CUfunction>(function), {grid[0], grid[1], grid[2]}, threads, shared, pdl,
                    cooperative, {}};
    for (const auto& p : params) {
      Param param{static_cast<int>(p[0]), static_cast<int>(p[1]), 0, 0};
      if (param.kind == kConstant) {
        if (param.size < 1 || param.size > 8) throw std::invalid_argument("a constant takes 1 to 8 bytes");
        param.bits = static_cast<uint64_t>(p[2]);
      } else {
        param.index = p[2];
      }
      bool fits = (param.kind == kSource && param.index >= 0 && param.index < static_cast<int64_t>(sources_.size()))
                  || (param.kind == kScratch && param.index >= 0 && param.index + 8 <= scratch_bytes_ + 8)
                  || (param.kind == kDescriptor && param.index >= 0
                      && param.index < static_cast<int64_t>(descriptors_.size()))
                  || param.kind == kConstant;
      if (!fits) throw std::invalid_argument("a parameter refers to nothing the plan holds");
      spec.params.push_back(param);
    }
    launches_.push_back(std::move(spec));
  }

  int64_t add_descriptor(int64_t source, py::object encode) {
    if (source < 0 || source >= static_cast<int64_t>(sources_.size()) || !sources_[source].present)
      throw std::invalid_argument("a descriptor's source is not a tensor source");
    descriptors_.push_back(Descriptor{source, std::move(encode), {}});
    return static_cast<int64_t>(descriptors_.size()) - 1;
  }

  // A view returned after the outputs: ``inputs[source]``'s first ``end`` entries along ``dim``
  // (build_view's page table when it is the block table's first columns).
  void add_slice(int64_t source, int64_t dim, int64_t end) {
    if (source < 0 || source >= inputs_ || !sources_[source].present || dim < 0
        || dim >= static_cast<int64_t>(sources_[source].sizes.size()) || end < 0
        || end > sources_[source].sizes[dim])
      throw std::invalid_argument("a slice outside its source");
    slices_.push_back({source, dim, end});
  }

  // The slices of ``inputs`` (for the tests; run() returns them after the outputs).
  py::object views(py::tuple inputs) const {
    std::vector<const at::Tensor*> tensors;
    if (static_cast<int64_t>(py::len(inputs)) != inputs_ || !gather(inputs, &tensors)) return py::none();
    py::tuple result(slices_.size());
    for (size_t i = 0; i < slices_.size(); ++i) result[i] = sliced(tensors, i);
    return std::move(result);
  }

  // Whether ``given`` (inputs, or inputs and outputs) has the recorded layouts.
  bool matches(py::tuple given) const { return gather(given, nullptr); }

  // Allocate the outputs, launch everything for ``inputs`` on ``stream``; None where a layout differs.
  py::object run(uint64_t stream, py::tuple inputs) {
    if (observed()) return py::none();
    std::vector<at::Tensor> held;
    std::vector<const at::Tensor*> tensors;
    if (static_cast<int64_t>(py::len(inputs)) != inputs_ || !gather(inputs, &tensors)) return py::none();
    held.reserve(outputs_.size());
    if (outputs_.size() == 1 || allocation_ != kOneBlock) {
      for (const auto& out : outputs_) held.push_back(allocate(out.sizes, out.dtype));
    } else if (!outputs_.empty()) {
      // One allocation for every output, each a tensor over its own bytes of the block: a
      // TensorImpl costs less than an allocation, and one call's outputs die about together.
      at::Tensor block = allocate({block_bytes_}, at::kByte);
      for (const auto& out : outputs_) held.push_back(part(block, out));
    }
    for (const auto& t : held) tensors.push_back(&t);
    launch_all(stream, tensors);
    py::tuple result(held.size() + slices_.size());
    for (size_t i = 0; i < held.size(); ++i) result[i] = py::reinterpret_steal<py::object>(THPVariable_Wrap(held[i]));
    for (size_t i = 0; i < slices_.size(); ++i) result[held.size() + i] = sliced(tensors, i);
    return std::move(result);
  }

  // Each launch's parameters as the kernel takes them, concatenated (for the tests).
  py::bytes pack(size_t index, py::tuple sources, uint64_t scratch) {
    std::vector<const at::Tensor*> tensors;
    if (index >= launches_.size() || py::len(sources) != sources_.size() || !gather(sources, &tensors))
      throw std::invalid_argument("no such launch, or the sources do not match");
    std::vector<void*> params;
    std::vector<uint64_t> words;
    fill(launches_[index], tensors, scratch, &params, &words);
    std::string bytes;
    for (size_t i = 0; i < params.size(); ++i)
      bytes.append(static_cast<const char*>(params[i]), launches_[index].params[i].size);
    return py::bytes(bytes);
  }

  size_t num_launches() const { return launches_.size(); }
  int allocation() const { return allocation_; }
  void set_allocation(int mode) {
    if (mode < kEmpty || mode > kOneBlock) throw std::invalid_argument("allocation is 0, 1 or 2");
    allocation_ = mode;
  }

 private:
  // Whether a dispatch or function mode, or the profiler, is on in this thread: they expect to see
  // the ops (the Python path). The API's fast path leaves these checks to this call.
  static bool observed() {
    return c10::impl::TorchDispatchModeTLS::stack_len() > 0 || at::impl::torch_function_mode_enabled()
           || torch::profiler::impl::profilerEnabled();
  }

  // A contiguous tensor as torch.empty makes it on the current device (the caller checked it is the
  // plan's), from the recorded outputs' allocator: at::empty's dispatch cost ~0.5 us an allocation
  // on the H200's host (docs/performance.md, "Native plans"). Where at::empty does more (deterministic
  // mode fills new memory), or no allocator was recorded, at::empty itself.
  at::Tensor allocate(at::IntArrayRef sizes, at::ScalarType dtype) const {
    const auto& context = at::globalContext();
    if (allocator_ == nullptr || allocation_ == kEmpty
        || (context.deterministicAlgorithms() && context.deterministicFillUninitializedMemory()))
      return at::empty(sizes, at::TensorOptions().device(device_).dtype(dtype));
    at::Tensor made(at::detail::empty_generic(sizes, allocator_, keys_, dtype, std::nullopt));
    // The allocator serves the current device: a plan on another one takes at::empty's guard.
    return made.device() == device_ ? made : at::empty(sizes, at::TensorOptions().device(device_).dtype(dtype));
  }

  // The tensor of ``out``'s sizes and dtype at its offset into ``block``'s storage (contiguous,
  // no view of ``block``: a tensor of its own, as torch.empty would make it, that shares the memory).
  at::Tensor part(const at::Tensor& block, const OutputSpec& out) const {
    auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(block.storage()), keys_,
                                                    c10::scalarTypeToTypeMeta(out.dtype));
    impl->set_sizes_contiguous(out.sizes);
    impl->set_storage_offset(out.offset / static_cast<int64_t>(c10::elementSize(out.dtype)));
    return at::Tensor(std::move(impl));
  }

  // Check ``given`` against the recorded sources; collect their tensors (None: nullptr).
  bool gather(py::tuple given, std::vector<const at::Tensor*>* tensors) const {
    size_t count = py::len(given);
    if (count > sources_.size()) return false;
    if (tensors != nullptr) tensors->reserve(sources_.size());
    for (size_t i = 0; i < count; ++i) {
      PyObject* item = PyTuple_GET_ITEM(given.ptr(), i);
      const SourceSpec& spec = sources_[i];
      if (item == Py_None) {
        if (spec.present) return false;
        if (tensors != nullptr) tensors->push_back(nullptr);
        continue;
      }
      if (!spec.present || !THPVariable_CheckExact(item)) return false;
      const at::Tensor& t = THPVariable_Unpack(item);
      if (t.scalar_type() != spec.dtype || t.device() != device_ || !t.sizes().equals(spec.sizes)
          || !t.strides().equals(spec.strides) || t.requires_grad()
          || ((reinterpret_cast<uintptr_t>(t.data_ptr()) & 15) == 0) != spec.aligned)
        return false;
      if (tensors != nullptr) tensors->push_back(&t);
    }
    return true;
  }

  py::object sliced(const std::vector<const at::Tensor*>& tensors, size_t index) const {
    const auto& s = slices_[index];
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(tensors[s[0]]->slice(s[1], 0, s[2])));
  }

  const CUtensorMap* encoded(Descriptor& desc, const at::Tensor& base) {
    uint64_t address = reinterpret_cast<uintptr_t>(base.data_ptr());
    auto found = desc.maps.find(address);
    if (found != desc.maps.end()) return found->second.get();
    py::object made = desc.encode(py::reinterpret_steal<py::object>(THPVariable_Wrap(base)));
    auto map = std::make_unique<CUtensorMap>();
    if (py::isinstance<py::bytes>(made)) {
      std::string bytes = made.cast<std::string>();
      if (bytes.size() != sizeof(CUtensorMap)) throw std::invalid_argument("an encoded map is not 128 bytes");
      std::memcpy(map.get(), bytes.data(), sizeof(CUtensorMap));
    } else {
      PyTypeObject* type = Py_TYPE(made.ptr());
      if (std::string(type->tp_name) != "triton.backends.nvidia.PyCUtensorMap"
          || type->tp_basicsize != static_cast<Py_ssize_t>(sizeof(PyTensorMap)))
        throw std::invalid_argument("an encoded map is neither bytes nor Triton's PyCUtensorMap");
      std::memcpy(map.get(), &reinterpret_cast<PyTensorMap*>(made.ptr())->map, sizeof(CUtensorMap));
    }
    if (desc.maps.size() >= kMaxMaps) desc.maps.clear();
    const CUtensorMap* kept = map.get();
    desc.maps.emplace(address, std::move(map));
    return kept;
  }

  void fill(const LaunchSpec& spec, const std::vector<const at::Tensor*>& tensors, uint64_t scratch,
            std::vector<void*>* params, std::vector<uint64_t>* words) {
    words->assign(spec.params.size(), 0);
    params->resize(spec.params.size());
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const Param& p = spec.params[i];
      uint64_t& word = (*words)[i];
      (*params)[i] = &word;
      switch (p.kind) {
        case kSource: {
          const at::Tensor* t = tensors[p.index];
          word = t == nullptr ? 0 : reinterpret_cast<uintptr_t>(t->data_ptr());
          break;
        }
        case kScratch:
          word = scratch + static_cast<uint64_t>(p.index);
          break;
        case kConstant:
          word = p.bits;
          break;
        default: {   // kDescriptor
          Descriptor& desc = descriptors_[p.index];
          (*params)[i] = const_cast<CUtensorMap*>(encoded(desc, *tensors[desc.source]));
        }
      }
    }
  }

  void launch_all(uint64_t stream, const std::vector<const at::Tensor*>& tensors) {
    if (launches_.empty()) return;   // outputs alone (no driver needed: the CPU tests' allocations)
    const Driver& d = driver();
    if (d.launch == nullptr || d.ctx_get == nullptr) throw std::runtime_error("mla_dcp native launch: no CUDA driver");
    CUcontext context = nullptr;
    check(d.ctx_get(&context), "cuCtxGetCurrent");
    if (context == nullptr) {   // a thread that has not touched the device: its primary context, as Triton does
      CUdevice device;
      check(d.device_get(&device, device_.index()), "cuDeviceGet");
      check(d.primary_retain(&context, device), "cuDevicePrimaryCtxRetain");
      check(d.ctx_set(context), "cuCtxSetCurrent");
    }
    // Held until every launch is enqueued (the allocator may hand a freed block out again).
    at::Tensor scratch;
    uint64_t base = 0;
    if (scratch_bytes_ > 0) {
      scratch = allocate({scratch_bytes_}, at::kByte);
      base = reinterpret_cast<uintptr_t>(scratch.data_ptr());
    }
    std::vector<void*> params;
    std::vector<uint64_t> words;
    for (const LaunchSpec& spec : launches_) {
      if (spec.grid[0] * spec.grid[1] * spec.grid[2] == 0) continue;
      fill(spec, tensors, base, &params, &words);
      CUlaunchAttribute attrs[2];
      std::memset(attrs, 0, sizeof(attrs));
      unsigned count = 0;
      if (spec.pdl) {
        attrs[count].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[count].value.programmaticStreamSerializationAllowed = 1;
        ++count;
      }
      if (spec.cooperative) {
        attrs[count].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        attrs[count].value.cooperative = 1;
        ++count;
      }
      CUlaunchConfig config;
      std::memset(&config, 0, sizeof(config));
      config.gridDimX = spec.grid[0];
      config.gridDimY = spec.grid[1];
      config.gridDimZ = spec.grid[2];
      config.blockDimX = spec.threads;
      config.blockDimY = 1;
      config.blockDimZ = 1;
      config.sharedMemBytes = spec.shared;
      config.hStream = reinterpret_cast<CUstream>(stream);
      config.attrs = attrs;
      config.numAttrs = count;
      CUresult launched;
      {
        // As Triton's launcher does: a launch that waits for room in the queue blocks no other thread.
        py::gil_scoped_release unlocked;
        launched = d.launch(&config, spec.function, params.data(), nullptr);
      }
      check(launched, "cuLaunchKernelEx");
    }
  }

  int64_t inputs_;
  int64_t scratch_bytes_;
  at::Device device_;
  c10::Allocator* allocator_ = nullptr;
  int64_t block_bytes_ = 0;
  c10::DispatchKeySet keys_;
  // How a call allocates: kOneBlock (one block for all outputs, from the recorded allocator), or to
  // measure against it kDirect (one allocation an output, from the allocator) or kEmpty (at::empty).
  int allocation_ = kOneBlock;
  std::vector<SourceSpec> sources_;
  std::vector<OutputSpec> outputs_;
  std::vector<LaunchSpec> launches_;
  std::vector<Descriptor> descriptors_;
  std::vector<std::array<int64_t, 3>> slices_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Plan>(m, "Plan")
      .def(py::init<py::sequence, int64_t, int64_t>(), py::arg("sources"), py::arg("inputs"),
           py::arg("scratch_bytes"))
      .def("add_launch", &Plan::add_launch)
      .def("add_descriptor", &Plan::add_descriptor)
      .def("add_slice", &Plan::add_slice)
      .def("views", &Plan::views)
      .def("matches", &Plan::matches)
      .def("run", &Plan::run)
      .def("pack", &Plan::pack)
      .def_property_readonly("num_launches", &Plan::num_launches)
      .def_property("allocation", &Plan::allocation, &Plan::set_allocation);
}
