// feedline/pipeline/sources.hpp: every kind of source this build has, registered. One #include line per
// kind: each header registers itself with the source registry (pipeline/source.hpp) when included.
#pragma once

#include <feedline/pipeline/source.hpp>

#include <feedline/pipeline/shard_source.hpp>
#include <feedline/pipeline/text_source.hpp>
