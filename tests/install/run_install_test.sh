#!/bin/sh
# Installs the build into a scratch prefix, then builds the consumer with
# find_package(hvd) and with pkg-config, and runs both under the installed
# hvdrun. Usage: run_install_test.sh BUILD_DIR SOURCE_DIR
# CONSUMER_CFLAGS: flags the consumer needs (a sanitizer build's).
set -eu
cflags=${CONSUMER_CFLAGS:-}
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
for f in include/hvd/hvd.h include/hvd/types.h bin/hvdrun lib/libhvd.so \
         lib/libhvd.a lib/pkgconfig/hvd.pc lib/cmake/hvd/hvdConfig.cmake; do
    [ -e "$tmp/prefix/$f" ] || { echo "missing after install: $f"; exit 1; }
done

cmake -S "$src" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
    -DCMAKE_C_FLAGS="$cflags" >/dev/null
cmake --build "$tmp/cm" >/dev/null
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
# shellcheck disable=SC2046,SC2086
cc $cflags "$src/consumer.c" $(pkg-config --cflags --libs hvd) \
    -o "$tmp/consumer_pc"

export LD_LIBRARY_PATH="$tmp/prefix/lib"
"$tmp/prefix/bin/hvdrun" -np 2 "$tmp/cm/consumer"
"$tmp/prefix/bin/hvdrun" -np 2 "$tmp/consumer_pc"
echo "install test: PASS"
