// feedline/pipeline.hpp: the public entry point. One include gives the whole library: the pipeline
// (token shards and JSONL/text, alone or blended -> sampler -> workers -> staging ring -> trainer) and
// every layer under it: storage backends, dataset formats, sampling, tokenization and collation, the
// execution core, topology and device staging (the pinned ring when built with CUDA, the host ring
// always).
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
#include <feedline/exec/trainer_cpu.hpp>
#include <feedline/format/dataset.hpp>
#include <feedline/format/dtype.hpp>
#include <feedline/format/json_fields.hpp>
#include <feedline/format/llmc.hpp>
#include <feedline/format/megatron.hpp>
#include <feedline/format/text.hpp>
#include <feedline/format/text_corpus.hpp>
#include <feedline/format/token_lengths.hpp>
#include <feedline/output/atomic_file.hpp>
#include <feedline/output/output_lock.hpp>
#include <feedline/pipeline/batch.hpp>
#include <feedline/pipeline/config.hpp>
#include <feedline/pipeline/data_spec.hpp>
#include <feedline/pipeline/defaults.hpp>
#include <feedline/pipeline/options.hpp>
#include <feedline/pipeline/pipeline.hpp>
#include <feedline/pipeline/shard_source.hpp>
#include <feedline/pipeline/source.hpp>
#include <feedline/pipeline/state.hpp>
#include <feedline/pipeline/stats.hpp>
#include <feedline/pipeline/text_source.hpp>
#include <feedline/sampling/mixer.hpp>
#include <feedline/sampling/mixture_file.hpp>
#include <feedline/sampling/mixture_schedule.hpp>
#include <feedline/sampling/permutation.hpp>
#include <feedline/sampling/sampler.hpp>
#include <feedline/sampling/state_io.hpp>
#include <feedline/sampling/windows.hpp>
#include <feedline/storage/reader.hpp>
#include <feedline/storage/schemes.hpp>
#include <feedline/transform/collate.hpp>
#include <feedline/transform/tokenize_in_order.hpp>
#include <feedline/transform/tokenizer.hpp>
#include <feedline/transform/tokenizers.hpp>
#include <feedline/version.hpp>
