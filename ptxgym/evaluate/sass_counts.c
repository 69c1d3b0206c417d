/* Executed SASS instructions per instruction address, through CUPTI's SASS Metrics API.
 *
 * Built once per machine by the judge (ptxgym.evaluate.cupti_helper) and loaded with ctypes by a
 * count run (ptxgym.evaluate.single_call) before the candidate's library. The run calls, in
 * order: ptxgym_sass_prepare (before the candidate's code is loaded), ptxgym_sass_enable, the
 * candidate, ptxgym_sass_collect, then reads the records and calls ptxgym_sass_disable.
 *
 * cupti-python does not bind this API, hence C. Every function returns 0 or a CUPTI/CUDA error
 * code; ptxgym_sass_error() says which call failed and why.
 */
#include <cuda.h>
#include <cupti_activity.h>
#include <cupti_profiler_target.h>
#include <cupti_result.h>
#include <cupti_sass_metrics.h>
#include <cupti_target.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_METRICS 8

static char error_text[512];
static uint64_t metric_ids[MAX_METRICS];
static size_t metric_count;
static size_t device;
static int enabled;

/* What one flush returned, summed per (record, metric): CUPTI gives one value per instance
 * (one instance at GPU granularity). */
static CUpti_SassMetrics_Data *records;
static CUpti_SassMetrics_InstanceValue *values;
static size_t record_count;
static size_t instance_count;

static int failed(const char *call, CUptiResult result) {
    const char *text = "unknown error";
    cuptiGetResultString(result, &text);
    snprintf(error_text, sizeof error_text, "%s: %s (%d)", call, text, (int)result);
    return (int)result;
}

#define CHECK(call)                                        \
    do {                                                   \
        CUptiResult result_ = (call);                      \
        if (result_ != CUPTI_SUCCESS) return failed(#call, result_); \
    } while (0)

const char *ptxgym_sass_error(void) { return error_text; }

/* The activity buffers of the warm-up below: CUPTI asks for one and hands it back. */
static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *size = 1 << 16;
    *buffer = (uint8_t *)aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t *buffer,
                                      size_t size, size_t valid_size) {
    (void)context, (void)stream, (void)size, (void)valid_size;
    free(buffer);
}

/* The driver calls of the warm-up, from the libcuda this process already uses (the helper is
 * not linked to libcuda: building it needs no driver). */
typedef CUresult (*mem_alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*memset_fn)(CUdeviceptr, unsigned int, size_t);
typedef CUresult (*synchronize_fn)(void);
typedef CUresult (*mem_free_fn)(CUdeviceptr);

static CUresult memset_once(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (cuda == NULL) cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (cuda == NULL) return CUDA_ERROR_NOT_FOUND;
    mem_alloc_fn mem_alloc = (mem_alloc_fn)dlsym(cuda, "cuMemAlloc_v2");
    memset_fn memset_d32 = (memset_fn)dlsym(cuda, "cuMemsetD32_v2");
    synchronize_fn synchronize = (synchronize_fn)dlsym(cuda, "cuCtxSynchronize");
    mem_free_fn mem_free = (mem_free_fn)dlsym(cuda, "cuMemFree_v2");
    if (!mem_alloc || !memset_d32 || !synchronize || !mem_free) return CUDA_ERROR_NOT_FOUND;
    CUdeviceptr scratch;
    CUresult status = mem_alloc(&scratch, 4);
    if (status != CUDA_SUCCESS) return status;
    status = memset_d32(scratch, 0, 1);
    if (status == CUDA_SUCCESS) status = synchronize();
    CUresult freed = mem_free(scratch);
    return status != CUDA_SUCCESS ? status : freed;
}

/* On the H200 with CUDA 13.0, SASS metrics counted only the first kernel of a process unless
 * the Activity API had been enabled, used and disabled before: so it is, on a memset, here. */
static int warm_up_activity(void) {
    CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
    CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CUresult status = memset_once();
    if (status != CUDA_SUCCESS) {
        snprintf(error_text, sizeof error_text, "activity warm-up: CUDA error %d", (int)status);
        return (int)status;
    }
    CHECK(cuptiActivityFlushAll(1));
    CHECK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CHECK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMSET));
    return 0;
}

/* Set up counting of `names` (SASS metric names) on `device_index` of the current context. */
int ptxgym_sass_prepare(int device_index, const char *const *names, int count) {
    if (count < 1 || count > MAX_METRICS) {
        snprintf(error_text, sizeof error_text, "between 1 and %d metrics, not %d", MAX_METRICS,
                 count);
        return -1;
    }
    device = (size_t)device_index;
    int warm = warm_up_activity();
    if (warm != 0) return warm;

    CUpti_Profiler_Initialize_Params initialize = {.structSize = CUpti_Profiler_Initialize_Params_STRUCT_SIZE};
    CHECK(cuptiProfilerInitialize(&initialize));
    CUpti_Device_GetChipName_Params chip = {.structSize = CUpti_Device_GetChipName_Params_STRUCT_SIZE};
    chip.deviceIndex = device;
    CHECK(cuptiDeviceGetChipName(&chip));

    CUpti_SassMetrics_Config configs[MAX_METRICS];
    for (int i = 0; i < count; ++i) {
        CUpti_SassMetrics_GetProperties_Params properties = {
            .structSize = CUpti_SassMetrics_GetProperties_Params_STRUCT_SIZE};
        properties.pChipName = chip.pChipName;
        properties.pMetricName = names[i];
        CHECK(cuptiSassMetricsGetProperties(&properties));
        metric_ids[i] = properties.metric.metricId;
        configs[i].metricId = properties.metric.metricId;
        configs[i].outputGranularity = CUPTI_SASS_METRICS_OUTPUT_GRANULARITY_GPU;
    }
    metric_count = (size_t)count;
    CUpti_SassMetricsSetConfig_Params config = {.structSize = CUpti_SassMetricsSetConfig_Params_STRUCT_SIZE};
    config.numOfMetricConfig = metric_count;
    config.pConfigs = configs;
    config.deviceIndex = (uint32_t)device;
    CHECK(cuptiSassMetricsSetConfig(&config));
    return 0;
}

/* The id CUPTI gave metric `index` of those prepared (records name metrics by id). */
uint64_t ptxgym_sass_metric_id(int index) {
    return index >= 0 && (size_t)index < metric_count ? metric_ids[index] : 0;
}

/* Count from here: each function is patched when it first runs (lazy patching), so only the
 * kernels launched while counting are patched, not every function of every loaded module. */
int ptxgym_sass_enable(void) {
    CUpti_SassMetricsEnable_Params enable = {.structSize = CUpti_SassMetricsEnable_Params_STRUCT_SIZE};
    enable.ctx = NULL;
    enable.enableLazyPatching = 1;
    CHECK(cuptiSassMetricsEnable(&enable));
    enabled = 1;
    return 0;
}

/* Take everything counted so far (after the work has finished: synchronize first). */
int ptxgym_sass_collect(void) {
    CUpti_SassMetricsGetDataProperties_Params properties = {
        .structSize = CUpti_SassMetricsGetDataProperties_Params_STRUCT_SIZE};
    properties.ctx = NULL;
    CHECK(cuptiSassMetricsGetDataProperties(&properties));
    record_count = properties.numOfPatchedInstructionRecords;
    instance_count = properties.numOfInstances;
    if (record_count == 0) return 0;
    records = calloc(record_count, sizeof *records);
    values = calloc(record_count * (instance_count ? instance_count : 1), sizeof *values);
    if (records == NULL || values == NULL) {
        snprintf(error_text, sizeof error_text, "out of memory for %zu records", record_count);
        return -1;
    }
    for (size_t i = 0; i < record_count; ++i) {
        records[i].structSize = sizeof records[i];
        records[i].pInstanceValues = values + i * instance_count;
    }
    CUpti_SassMetricsFlushData_Params flush = {.structSize = CUpti_SassMetricsFlushData_Params_STRUCT_SIZE};
    flush.ctx = NULL;
    flush.numOfPatchedInstructionRecords = record_count;
    flush.numOfInstances = instance_count;
    flush.pMetricsData = records;
    CHECK(cuptiSassMetricsFlushData(&flush));
    return 0;
}

size_t ptxgym_sass_record_count(void) { return record_count; }

/* Record `index`: its function's name, its offset in the function, and its value for metric
 * `metric_id` summed over instances (0 when the record holds none of that metric). */
int ptxgym_sass_record(size_t index, uint64_t metric_id, const char **function, uint32_t *pc,
                       uint64_t *value) {
    if (index >= record_count) return -1;
    *function = records[index].functionName;
    *pc = records[index].pcOffset;
    uint64_t sum = 0;
    for (size_t i = 0; i < instance_count; ++i) {
        if (records[index].pInstanceValues[i].metricId == metric_id)
            sum += records[index].pInstanceValues[i].value;
    }
    *value = sum;
    return 0;
}

/* Stop counting and drop the configuration. */
int ptxgym_sass_disable(void) {
    if (enabled) {
        CUpti_SassMetricsDisable_Params disable = {.structSize = CUpti_SassMetricsDisable_Params_STRUCT_SIZE};
        disable.ctx = NULL;
        CHECK(cuptiSassMetricsDisable(&disable));
        enabled = 0;
    }
    CUpti_SassMetricsUnsetConfig_Params unset = {.structSize = CUpti_SassMetricsUnsetConfig_Params_STRUCT_SIZE};
    unset.deviceIndex = (uint32_t)device;
    CHECK(cuptiSassMetricsUnsetConfig(&unset));
    return 0;
}
