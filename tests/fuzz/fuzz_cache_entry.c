/* libFuzzer target: the disk cache's entry parser (fcl_cache_parse_entry), which reads files that anyone
 * able to write the cache directory controls. The key is taken from the input's own header so the parser
 * is driven past the key check; the first byte's low bit also rewrites the checksum so that well-formed
 * entries parse, and the payload returned is then checked to lie inside the input. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static const char name[] = "flash_fwd";
static const char options[] = "-cl-std=CL1.2 -DDTYPE=0 -DD=64";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const int fix_checksum = data[0] & 1;
  ++data, --size;
  unsigned char *copy = malloc(size ? size : 1); /* exact size, so ASan sees any read past the end */
  if (!copy) return 0;
  memcpy(copy, data, size);
  fcl_cache_key key;
  memset(&key, 0, sizeof key);
  if (size >= 16 + FCL_CACHE_KEY_SIZE) memcpy(key.bytes, copy + 16, FCL_CACHE_KEY_SIZE);
  if (fix_checksum && size > FCL_CACHE_HEADER_SIZE)
    fcl_sha256(copy + FCL_CACHE_HEADER_SIZE, size - FCL_CACHE_HEADER_SIZE, copy + 72);
  size_t payload_size = 0;
  const unsigned char *payload = fcl_cache_parse_entry(copy, size, &key, name, options, &payload_size);
  if (payload &&
      (payload < copy + FCL_CACHE_HEADER_SIZE || payload_size > size || payload + payload_size != copy + size))
    abort(); /* a payload outside the entry */
  free(copy);
  return 0;
}
