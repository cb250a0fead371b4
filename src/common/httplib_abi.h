// common/httplib_abi.h - the one way to include cpp-httplib in Granary (private to src/common).
//
// Debian's libcpp-httplib.so is built with these three; httplib's structs (Request, ClientImpl)
// change layout with them, so every includer must agree with the library or memory gets corrupted.
#pragma once

#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#define CPPHTTPLIB_OPENSSL_SUPPORT
#endif
#ifndef CPPHTTPLIB_ZLIB_SUPPORT
#define CPPHTTPLIB_ZLIB_SUPPORT
#endif
#ifndef CPPHTTPLIB_BROTLI_SUPPORT
#define CPPHTTPLIB_BROTLI_SUPPORT
#endif
#include <httplib.h>
