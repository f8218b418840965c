// feedline/pipeline.hpp: the public entry point. One include gives the whole library: storage
// backends, dataset formats and (as they land) sampling, workers and device staging.
#pragma once

#include <feedline/error.hpp>
#include <feedline/format/dataset.hpp>
#include <feedline/format/dtype.hpp>
#include <feedline/format/llmc.hpp>
#include <feedline/format/megatron.hpp>
#include <feedline/format/text.hpp>
#include <feedline/storage/reader.hpp>
#include <feedline/version.hpp>
