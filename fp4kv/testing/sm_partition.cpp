// Green contexts through the driver's entry points found by the runtime (nothing links
// libcuda; the CUDA 12.4 function-pointer forms of cudaTypedefs.h).
#include "fp4kv/testing/sm_partition.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <string>

#include "fp4kv/core/error.h"

namespace fp4kv::testing {

namespace {

constexpr unsigned kGreenContextCudaVersion = 12040;  // green contexts appeared in CUDA 12.4
constexpr unsigned kContextCudaVersion = 4000;
constexpr unsigned kDeviceCudaVersion = 2000;

int g_confined_sms = 0;  // 0: not confined

template <class Fn>
Fn driver_entry(const char* name, unsigned version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found);
  require(e == cudaSuccess && found == cudaDriverEntryPointSuccess && fn != nullptr,
          std::string("confine_to_sms: the CUDA driver has no ") + name + " (green contexts need CUDA 12.4+)");
  return reinterpret_cast<Fn>(fn);
}

// The current device and its SM count; false where CUDA cannot say.
bool current_device_sm_count(int& dev, int& sms) {
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess;
}

void driver_ok(CUresult r, const char* what) {
  require(r == CUDA_SUCCESS,
          std::string("confine_to_sms: ") + what + " failed (CUresult " + std::to_string(int(r)) + ")");
}

}  // namespace

int confine_to_sms(int sms) {
  require(g_confined_sms == 0, "confine_to_sms: this process is already confined");
  int dev = 0, total = 0;
  require(current_device_sm_count(dev, total), "confine_to_sms: no CUDA device, or its SM count cannot be read");
  require(sms >= 1 && sms <= total, "confine_to_sms: " + std::to_string(sms) + " SMs asked, the device has " +
                                        std::to_string(total));
  const auto device_get = driver_entry<PFN_cuDeviceGet_v2000>("cuDeviceGet", kDeviceCudaVersion);
  const auto get_resource = driver_entry<PFN_cuDeviceGetDevResource_v12040>("cuDeviceGetDevResource",
                                                                             kGreenContextCudaVersion);
  const auto split = driver_entry<PFN_cuDevSmResourceSplitByCount_v12040>("cuDevSmResourceSplitByCount",
                                                                           kGreenContextCudaVersion);
  const auto make_desc = driver_entry<PFN_cuDevResourceGenerateDesc_v12040>("cuDevResourceGenerateDesc",
                                                                             kGreenContextCudaVersion);
  const auto create = driver_entry<PFN_cuGreenCtxCreate_v12040>("cuGreenCtxCreate", kGreenContextCudaVersion);
  const auto as_context = driver_entry<PFN_cuCtxFromGreenCtx_v12040>("cuCtxFromGreenCtx", kGreenContextCudaVersion);
  const auto set_current = driver_entry<PFN_cuCtxSetCurrent_v4000>("cuCtxSetCurrent", kContextCudaVersion);

  CUdevice cu_dev{};
  driver_ok(device_get(&cu_dev, dev), "cuDeviceGet");
  CUdevResource all{};
  driver_ok(get_resource(cu_dev, &all, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource");
  CUdevResource group{};
  unsigned groups = 1;
  driver_ok(split(&group, &groups, &all, nullptr, 0, unsigned(sms)), "cuDevSmResourceSplitByCount");
  require(groups == 1, "confine_to_sms: the driver made no group of " + std::to_string(sms) + " SMs (partitions of " +
                           std::to_string(all.sm.minSmPartitionSize) + " SMs at least, in steps of " +
                           std::to_string(all.sm.smCoscheduledAlignment) + ")");
  CUdevResourceDesc desc{};
  driver_ok(make_desc(&desc, &group, 1), "cuDevResourceGenerateDesc");
  CUgreenCtx green{};
  driver_ok(create(&green, desc, cu_dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate");
  CUcontext ctx{};
  driver_ok(as_context(&ctx, green), "cuCtxFromGreenCtx");
  driver_ok(set_current(ctx), "cuCtxSetCurrent");
  // The green context lives as long as the process: nothing destroys it.
  g_confined_sms = int(group.sm.smCount);
  return g_confined_sms;
}

int usable_sms() {
  if (g_confined_sms > 0) return g_confined_sms;
  int dev = 0, sms = 0;
  return current_device_sm_count(dev, sms) ? sms : 0;
}

}  // namespace fp4kv::testing
