// feedline/storage/schemes.hpp: every storage scheme this build has, registered. Local paths are built
// in (storage/storage_scheme.hpp); each other scheme is one header that registers itself when included,
// with its #include line here. feedline/pipeline.hpp includes this header, so a program that includes
// the library has every scheme listed here.
#pragma once

#include <feedline/storage/storage_scheme.hpp>
