// feedline/storage/schemes.hpp: every storage scheme this build has, registered. Local paths are built
// in (storage/storage_scheme.hpp); each other scheme is one header that registers itself when included,
// with its #include line here. feedline/pipeline.hpp includes this header, so a program that includes
// the library has every scheme listed here.
#pragma once

#include <feedline/storage/storage_scheme.hpp>

#include <feedline/remote/s3_scheme.hpp>  // s3:// (refused with the reason when built without libcurl)
