// feedline/pipeline.hpp: the public entry point. One include gives the whole library: the pipeline
// (dataset or text -> sampler -> workers -> staging ring -> trainer) and every layer under it: storage
// backends, dataset formats, sampling, queues, the ordered worker pool, topology and device staging
// (the pinned ring when built with CUDA, the host ring always).
#pragma once

#include <feedline/device/cuda_runtime.hpp>
#include <feedline/device/host_ring.hpp>
#include <feedline/device/make_ring.hpp>
#include <feedline/device/pinned_ring.hpp>
#include <feedline/device/staging_ring.hpp>
#include <feedline/error.hpp>
#include <feedline/exec/numa_memory.hpp>
#include <feedline/exec/queue.hpp>
#include <feedline/exec/reorder.hpp>
#include <feedline/exec/topology.hpp>
#include <feedline/exec/worker_pool.hpp>
#include <feedline/format/dataset.hpp>
#include <feedline/format/dtype.hpp>
#include <feedline/format/llmc.hpp>
#include <feedline/format/megatron.hpp>
#include <feedline/format/text.hpp>
#include <feedline/format/text_corpus.hpp>
#include <feedline/pipeline/batch.hpp>
#include <feedline/pipeline/config.hpp>
#include <feedline/pipeline/pipeline.hpp>
#include <feedline/pipeline/stats.hpp>
#include <feedline/pipeline/text_pipeline.hpp>
#include <feedline/pipeline/token_pipeline.hpp>
#include <feedline/sampling/permutation.hpp>
#include <feedline/sampling/sampler.hpp>
#include <feedline/sampling/state_io.hpp>
#include <feedline/sampling/windows.hpp>
#include <feedline/storage/reader.hpp>
#include <feedline/version.hpp>
