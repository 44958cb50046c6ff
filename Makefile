# duplex — non-recursive GNU Make build.
#   make            release build (build/release/duplex)
#   make debug      -O0 -g            (build/debug/)
#   make asan       ASan + UBSan      (build/asan/)
#   make tsan       ThreadSanitizer   (build/tsan/)
#   make test       install missing deps, build release + asan + tsan, run every test
#   make test-tsan  build tsan, run the threaded tests under it only
#   make bench      the kernels' micro-benchmarks (build/release/bench/; docs/bench.md)
#   make demo       build, synthesise the default model, run the main job
# CC=clang works too.  V selects the variant for the generic targets.
# Each step prints one short line ("  CC  src/engine/sched.c"); VERBOSE=1
# prints the full commands instead.

V ?= release
CC ?= cc
BUILD := build/$(V)

PKGS := libpcre2-8 libxxhash jansson libuv libcurl ucx libutf8proc libsodium hiredis
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lhttp_parser
CMOCKA_LIBS := $(shell pkg-config --libs cmocka 2>/dev/null)
# the tests parse the benchmark's SVG plot as XML
TEST_LIBS := $(CMOCKA_LIBS) -lexpat

# -Wvla: no stack array is sized at run time (one sized by a request's
# message count overflowed the event loop's stack).
# -ffp-contract=off: the engine's bit-exact batch invariance must not depend
# on whether the compiler fuses a*b+c; kernels use explicit FMAs.
BASE_CFLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wvla -Wno-unused-parameter \
	-ffp-contract=off -fno-strict-aliasing -pthread -Isrc $(PKG_CFLAGS)
ARCH ?= -march=native

ifeq ($(V),release)
  VFLAGS := -O2 -g $(ARCH)
else ifeq ($(V),debug)
  VFLAGS := -O0 -g $(ARCH)
else ifeq ($(V),asan)
  VFLAGS := -O1 -g $(ARCH) -fsanitize=address,undefined -fno-omit-frame-pointer \
	-fno-sanitize-recover=all
  VLDFLAGS := -fsanitize=address,undefined
else ifeq ($(V),tsan)
  # halt_on_error and per-process report files are set at run time
  # (scripts/lib.sh tsan_env), so that one report fails the test that found it.
  VFLAGS := -O1 -g $(ARCH) -fsanitize=thread -fno-omit-frame-pointer
  VLDFLAGS := -fsanitize=thread
else
  $(error unknown variant V=$(V) (release|debug|asan|tsan))
endif

ifeq ($(VERBOSE),1)
  Q :=
  say = @:
else
  Q := @
  say = @printf '  %-4s%s\n' $(1) $(2)
endif

CFLAGS_ALL := $(BASE_CFLAGS) $(VFLAGS) $(CFLAGS)
LDFLAGS_ALL := -pthread $(VLDFLAGS) $(LDFLAGS)
LIBS := $(PKG_LIBS) -lm

# Kernel files are compiled for their instruction set; the engine picks one
# at run time from the CPU's features.
# The AVX2 files must not pick up AVX-512 from -march=native: they are what an
# AVX2-only CPU runs, and the tests exercise them as such.
AVX2_ISA := -mavx2 -mfma -mf16c
AVX2_FLAGS := $(AVX2_ISA) -mno-avx512f
AVX512_FLAGS := $(AVX2_ISA) -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni
AMX_FLAGS := $(AVX512_FLAGS) -mavx512vbmi -mamx-tile -mamx-int8

# Every folder of src/ but cli/ is the library (the folders and their order:
# scripts/check_layers.sh, docs/architecture.md).
LIB_SRC := $(sort $(shell find src -name '*.c' -not -path 'src/cli/*'))
CLI_SRC := $(wildcard src/cli/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
LIB_A := $(BUILD)/libduplex.a
BIN := $(BUILD)/duplex

UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzz/%)
ITEST_SRC := $(wildcard tests/integration/itest_*.c)
ITEST_BIN := $(ITEST_SRC:tests/integration/%.c=$(BUILD)/tests/%)
# The kernels' micro-benchmarks, linked against the library like the tests;
# `make test` builds them too, so that they cannot rot.
BENCH_SRC := $(wildcard scripts/bench/bench_*.c)
BENCH_BIN := $(BENCH_SRC:scripts/bench/%.c=$(BUILD)/bench/%)

.PHONY: all release debug asan tsan tests bench test test-tsan soak demo clean fmt fuzz bench-server bench-router bench-structured bench-fronts
.DEFAULT_GOAL := all

all: $(BIN)

release:
	$(MAKE) V=release
debug:
	$(MAKE) V=debug
asan:
	$(MAKE) V=asan
tsan:
	$(MAKE) V=tsan

tests: $(BIN) $(UNIT_BIN) $(FUZZ_BIN) $(ITEST_BIN)

bench: $(BENCH_BIN)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)
	$(Q)$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(BUILD)/obj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)
	$(Q)$(CC) $(CFLAGS_ALL) $(AVX2_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)
	$(Q)$(CC) $(CFLAGS_ALL) $(AVX512_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%_amx.o: %_amx.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)
	$(Q)$(CC) $(CFLAGS_ALL) $(AMX_FLAGS) -MMD -MP -c $< -o $@

# Test objects are intermediate files to make: keep them, so that a change
# to the library relinks the tests instead of recompiling every one.
.SECONDARY:

$(LIB_A): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(call say,AR,$@)
	$(Q)rm -f $@
	$(Q)ar rcs $@ $^

$(BIN): $(CLI_OBJ) $(LIB_A)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS_ALL) -o $@ $(CLI_OBJ) $(LIB_A) $(LIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(LIB_A)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS_ALL) -o $@ $< $(LIB_A) $(LIBS) $(TEST_LIBS)

$(BUILD)/tests/itest_%: $(BUILD)/obj/tests/integration/itest_%.o $(LIB_A)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS_ALL) -o $@ $< $(LIB_A) $(LIBS) $(TEST_LIBS)

$(BUILD)/bench/%: $(BUILD)/obj/scripts/bench/%.o $(LIB_A)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS_ALL) -o $@ $< $(LIB_A) $(LIBS)

# Fuzz targets build two ways: with a replay main (runs the checked-in corpus,
# part of `make test`) and, with `make fuzz` under clang, with libFuzzer.
$(BUILD)/fuzz/%: $(BUILD)/obj/tests/fuzz/%.o $(BUILD)/obj/tests/fuzz/replay_main.o $(LIB_A)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS_ALL) -o $@ $< $(BUILD)/obj/tests/fuzz/replay_main.o $(LIB_A) $(LIBS)

test:
	@scripts/test.sh

test-tsan:
	@TEST_VARIANTS=tsan scripts/test.sh

soak:
	@scripts/soak.sh

demo:
	@scripts/demo.sh

fuzz:
	@scripts/fuzz.sh

bench-server: $(BIN)
	scripts/bench_server.sh $(BIN)

bench-router: $(BIN)
	scripts/bench_router.sh $(BIN)

bench-structured: $(BIN)
	scripts/bench_structured.sh $(BIN)

bench-fronts: $(BIN)
	scripts/bench_fronts.sh $(BIN)

# every tracked C file but the ones scripts/format_exempt.txt still lists
# (scripts/check_format.sh)
fmt:
	git ls-files '*.c' '*.h' | grep -vxF -f scripts/format_exempt.txt | xargs clang-format -i

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
