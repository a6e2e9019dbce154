#!/usr/bin/env bash
# The diffscope GUI in a real X window on the GPU machine, in one call: Xvfb, GLX (the NVIDIA driver's, else Mesa's
# softpipe), the CUDA backend, a random checkpoint of kajuma/DiffLlama-0.3B-handcut's shape (1.24 B parameters) and a
# 32K-token needle-in-a-haystack prompt; a screenshot, a per-frame lambda-drag log and a summary come back in $OUT.
#
#   tools/gui_on_device.sh pack        (here) both packs below
#   tools/gui_on_device.sh pack_gui    (here) build diffscope (BUILD_DIR, default build; PACK_COMMIT names the
#                                      commit when BUILD_DIR builds another checkout) and pack it with the shared
#                                      libraries the GPU machine lacks (not libcuda/cudart/cublas, which it has; a
#                                      small stand-in for libopenblas, used only by the CPU backend) into
#                                      .dev/gui_pack.tar.xz
#   tools/gui_on_device.sh pack_x11    (here) Debian 12's Xvfb, xkbcomp and keyboard data, Mesa's swrast DRI driver
#                                      (softpipe: libLLVM replaced by a stub, which saves 120 MB), libglvnd, the X
#                                      client libraries GLFW opens, glxinfo, xwd and DejaVu Sans into .dev/gui_x11.tar.xz
#   OUT=$OUT tools/gui_on_device.sh    (GPU machine, repo root; carry .dev/gui_pack.tar.xz and .dev/gui_x11.tar.xz)
#
# Run knobs (environment): BACKEND=cuda, TOKENS=32768, SMALL=1 (2-layer checkpoint, for a CPU test), GLMODE=auto
# (nvidia first, then mesa) | nvidia | mesa, REPLAY=8,0,1.5,60 (1,0,1.5,60 with SMALL), MOUSE=-1,-1 (ImGui's pointer,
# off the window; empty: Xvfb's, mid-screen), SIZE=WxH (the window, default 1600x1000; the screen is 1920x1080),
# HEAD=L.H (the head view; default the dragged layer's head 0), GUI_TIMEOUT=300 (seconds), X11_EXTRA (a folder copied
# over the unpacked X11 pack), GUI_ARGS (more diffscope
# flags, e.g. "--generate 32"), CKPT=/tmp/ds_kajuma_random
# (kept between calls while the machine is warm), FAMILY=phi4flash (a random Phi-4-mini-flash-shaped checkpoint;
# set CKPT to another folder with it).
# Everything is unpacked under /tmp (the packs' Xvfb looks for xkbcomp in /tmp/dsx, patched in): nothing goes to /
# except DejaVuSans.ttf into /usr/share/fonts/truetype/dejavu when no copy is there (the GUI's font path).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
GUI_PACK=.dev/gui_pack.tar.xz
X11_PACK=.dev/gui_x11.tar.xz
DSX=/tmp/dsx      # fixed: the packed Xvfb runs /tmp/dsx/xkbcomp (its "/usr/bin" is patched to this, same length)
DSG=/tmp/dsgui
GLIBC_LIBS='libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libresolv.so*|libutil.so*|libanl.so*'

# --- packing (on the build machine) ------------------------------------------------------------------------------
# Shared libraries of the ELF files given, found through LD_LIBRARY_PATH as set by the caller, minus glibc, the GPU
# driver and CUDA, and the names in $SKIP (a | list); copied (dereferenced) into $1.
collect_libs() {
  local dest=$1; shift
  local f n p
  for f in "$@"; do
    ldd "$f" | awk '/=>/ {print $1, $3}' | while read -r n p; do
      eval "case \"\$n\" in $GLIBC_LIBS|libcuda.so*|libcudart*|libcublas*|libnvidia*|libGLX_nvidia*${SKIP:+|$SKIP}) continue;; esac"
      if [ "$p" = "not" ]; then echo "pack: $f needs $n, which is not found" >&2; continue; fi
      [ -e "$dest/$n" ] || cp -L "$p" "$dest/$n"
    done
  done
}

pack_x11() {
  set -e
  local W=/tmp/ds_x11_pack
  local o="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=$W/lists -oDebug::NoLocking=1"
  rm -rf "$W/root" "$W/dsx" && mkdir -p "$W/lists/partial" "$W/debs" "$W/root" "$W/dsx/lib" "$W/dsx/dri" "$W/dsx/fonts"
  [ -n "$(ls "$W/lists" | grep -v partial)" ] || apt-get $o update -qq
  # Debian 12 (bookworm) packages; the X server, Mesa's DRI driver and GLX, glvnd, the libraries GLFW dlopens.
  local pkgs="xvfb x11-xkb-utils xkb-data libgl1-mesa-dri libglx-mesa0 libglapi-mesa libllvm15 libgl1 libglx0
    libglvnd0 libopengl0 mesa-utils-bin x11-apps fonts-dejavu-core libxfont2 libpixman-1-0 libunwind8 libaudit1
    libcap-ng0 libbsd0 libmd0 libgcrypt20 libgpg-error0 libselinux1 libpcre2-8-0 libsystemd0 libcap2 liblz4-1 liblzma5
    libzstd1 libxau6 libxdmcp6 libfontenc1 libfreetype6 libpng16-16 libbrotli1 zlib1g libbz2-1.0 libx11-6 libx11-xcb1
    libxcb1 libxcb-glx0 libxcb-dri2-0 libxcb-dri3-0 libxcb-present0 libxcb-randr0 libxcb-shm0 libxcb-sync1
    libxcb-xfixes0 libxext6 libxfixes3 libxxf86vm1 libxshmfence1 libxkbfile1 libxrandr2 libxrender1 libxcursor1
    libxinerama1 libxi6 libdrm2 libdrm-amdgpu1 libdrm-intel1 libdrm-nouveau2 libdrm-radeon1 libpciaccess0 libelf1
    libexpat1 libsensors5 libstdc++6 libgcc-s1"
  (cd "$W/debs" && rm -f ./*.deb && apt-get $o download $pkgs > ../download.log 2>&1) || { cat "$W/download.log"; return 1; }
  for f in "$W"/debs/*.deb; do dpkg -x "$f" "$W/root"; done
  local R=$W/root U=$W/root/usr/lib/x86_64-linux-gnu D=$W/dsx
  # Xvfb runs "<XKB_BIN_DIRECTORY>/xkbcomp"; the directory is compiled in as "/usr/bin": point it at /tmp/dsx.
  python3 - "$R/usr/bin/Xvfb" "$D/Xvfb" <<'PY'
import sys
d = bytearray(open(sys.argv[1], "rb").read())
old, new = b"/usr/bin\0", b"/tmp/dsx\0"
assert d.count(old) == 1, "Xvfb: expected one /usr/bin string"
i = d.find(old); d[i:i + len(old)] = new
open(sys.argv[2], "wb").write(d)
PY
  chmod +x "$D/Xvfb"
  cp "$R/usr/bin/xkbcomp" "$R/usr/bin/xwd" "$D/"
  cp "$R/usr/bin/glxinfo.x86_64-linux-gnu" "$D/glxinfo"
  cp "$U/dri/swrast_dri.so" "$D/dri/"
  cp -a "$R/usr/share/X11/xkb" "$D/xkb"
  cp "$R/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf" "$D/fonts/"
  # libLLVM-15 stand-in: the symbols swrast_dri.so imports, each aborting with its name, except the two that Mesa
  # calls while loading. Softpipe (GALLIUM_DRIVER=softpipe DRAW_USE_LLVM=0) never calls the rest.
  mkdir -p "$W/stub"
  nm -D --undefined-only "$D/dri/swrast_dri.so" | awk '/@LLVM_15/ {sub(/@LLVM_15/, "", $2); print $2}' | sort > "$W/stub/need"
  nm -D -S --defined-only "$U/libLLVM-15.so.1" | awk '{sub(/@@LLVM_15/, "", $NF); print $NF, $(NF-1), $(NF-2)}' | sort > "$W/stub/have"
  python3 - "$W/stub" <<'PY'
import sys
d = sys.argv[1]
need = set(open(d + "/need").read().split())
benign = {"LLVMIsMultithreaded": 1, "LLVMStartMultithreaded": 1}
out = ["#include <stdio.h>", "#include <stdlib.h>",
       'static void stub(const char* n) { fprintf(stderr, "libLLVM-15 stub: %s called; this Mesa runs softpipe only '
       '(GALLIUM_DRIVER=softpipe DRAW_USE_LLVM=0)\\n", n); abort(); }']
found = set()
for line in open(d + "/have"):
    name, typ, size = line.split()[:3]
    if name not in need or name in found:
        continue
    found.add(name)
    if name in benign:
        out.append(f"int {name}(void) {{ return {benign[name]}; }}")
    elif typ in "TtWwi":
        out.append(f'void {name}(void) {{ stub("{name}"); }}')
    else:  # typeinfo and vtables Mesa's C++ refers to: zeros of the right size
        out.append(f"__attribute__((aligned(16))) unsigned char {name}[{int(size, 16)}];")
missing = need - found
assert not missing, f"not in libLLVM-15: {sorted(missing)[:5]}"
open(d + "/stub.c", "w").write("\n".join(out) + "\n")
open(d + "/stub.map", "w").write("LLVM_15 { global: *; };\n")
PY
  gcc -O1 -shared -fPIC -o "$D/lib/libLLVM-15.so.1" "$W/stub/stub.c" -Wl,--version-script="$W/stub/stub.map" \
    -Wl,-soname,libLLVM-15.so.1
  strip "$D/lib/libLLVM-15.so.1"
  for l in libGL.so.1 libGLX.so.0 libGLdispatch.so.0 libOpenGL.so.0 libGLX_mesa.so.0 libXcursor.so.1 libXi.so.6 \
           libXrandr.so.2 libXinerama.so.1 libXrender.so.1 libXfixes.so.3 libXxf86vm.so.1 libX11-xcb.so.1; do
    cp -L "$U/$l" "$D/lib/"
  done
  LD_LIBRARY_PATH="$D/lib:$U:$R/lib/x86_64-linux-gnu" SKIP='libLLVM*' collect_libs "$D/lib" \
    "$D/Xvfb" "$D/xkbcomp" "$D/xwd" "$D/glxinfo" "$D/dri/swrast_dri.so" "$D"/lib/*.so*
  (cd "$W/debs" && ls) > "$D/PACKAGES"
  mkdir -p "$ROOT/.dev"
  tar -C "$D" -cf - . | xz -9e -T0 > "$ROOT/$X11_PACK"
  ls -la "$ROOT/$X11_PACK"
}

pack_gui() {
  set -e
  local B=${BUILD_DIR:-build}
  [ -f "$B/CMakeCache.txt" ] || cmake -S . -B "$B" -G Ninja -DDS_ENABLE_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  ninja -C "$B" diffscope
  rm -rf /tmp/ds_gui_pack && mkdir -p /tmp/ds_gui_pack/bin /tmp/ds_gui_pack/lib
  strip -o /tmp/ds_gui_pack/bin/diffscope "$B/diffscope"
  # libopenblas (36 MB) serves only the CPU backend: a plain C sgemm stands in, so that the binary loads.
  gcc -O2 -shared -fPIC -o /tmp/ds_gui_pack/lib/libopenblas.so.0 -Wl,-soname,libopenblas.so.0 tools/cblas_standin.c
  # The rest, found with the stand-in first (so none of openblas's own libraries); those the X11 pack carries are
  # left to it (both packs go onto LD_LIBRARY_PATH).
  local skip='libopenblas*'
  [ -f "$X11_PACK" ] && for l in $(tar -tJf "$X11_PACK" | sed -n 's|^\./lib/||p'); do [ -n "$l" ] && skip="$skip|$l"; done
  LD_LIBRARY_PATH=/tmp/ds_gui_pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} SKIP="$skip" collect_libs /tmp/ds_gui_pack/lib "$B/diffscope"
  # The commit the binary was built from (PACK_COMMIT when BUILD_DIR builds another checkout than this one).
  echo "${PACK_COMMIT:-$(git describe --always --dirty)}" > /tmp/ds_gui_pack/bin/COMMIT
  mkdir -p .dev && tar -C /tmp/ds_gui_pack -cf - bin lib | xz -9e -T0 > "$GUI_PACK"
  ls -la "$GUI_PACK"
}

case "${1:-run}" in
  pack) pack_x11 && pack_gui; exit $? ;;
  pack_x11) pack_x11; exit $? ;;
  pack_gui) pack_gui; exit $? ;;
  run) ;;
  *) echo "usage: $0 [pack|pack_gui|pack_x11|run]" >&2; exit 2 ;;
esac

# --- on the GPU machine --------------------------------------------------------------------------------------------
OUT=${OUT:-/tmp/gui_on_device_out}
mkdir -p "$OUT"
LOG=$OUT/gui.log
SUMMARY=$OUT/gui_summary.md
BACKEND=${BACKEND:-cuda}
TOKENS=${TOKENS:-32768}
GLMODE=${GLMODE:-auto}
if [ -n "${SMALL:-}" ]; then REPLAY=${REPLAY-1,0,1.5,60}; else REPLAY=${REPLAY-8,0,1.5,60}; fi  # REPLAY= : none
HEAD=${HEAD-${REPLAY%%,*}.0}  # the head view opens on the dragged layer (head 0); empty: the GUI's default
MOUSE=${MOUSE--1,-1}  # ImGui's pointer: off the window (Xvfb's rests mid-screen, over a panel: a tooltip); empty: Xvfb's
GUI_TIMEOUT=${GUI_TIMEOUT:-300}  # the GUI's --screenshot gives up by itself 240 s after its first frame
if [ -n "${SMALL:-}" ]; then CKPT=${CKPT:-/tmp/ds_kajuma_random_small}; else CKPT=${CKPT:-/tmp/ds_kajuma_random}; fi
if [ "$TOKENS" -ge 1024 ]; then TAG=${TAG:-$((TOKENS / 1024))k}; else TAG=${TAG:-$TOKENS}; fi
PROMPT=/tmp/ds_needle_$TOKENS.txt
DISP=:99
export PYTHONUNBUFFERED=1
: > "$LOG"
say() { echo "$*" | tee -a "$SUMMARY"; }
: > "$SUMMARY"
t_start=$(date +%s)
say "## diffscope GUI on $(uname -n) ($(date -u +%FT%TZ)): backend $BACKEND, $TOKENS tokens, GL $GLMODE"
command -v nvidia-smi >/dev/null && say "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"

# --- unpack --------------------------------------------------------------------------------------------------------
for p in "$GUI_PACK" "$X11_PACK"; do
  [ -f "$p" ] || { say "missing $p: run 'tools/gui_on_device.sh pack' on the build machine and carry both packs"; exit 1; }
done
rm -rf "$DSX" "$DSG" && mkdir -p "$DSX" "$DSG"
tar -C "$DSX" -xJf "$X11_PACK" && tar -C "$DSG" -xJf "$GUI_PACK" || { say "unpacking failed"; exit 1; }
# X11_EXTRA: a folder copied over the X11 pack's (its dri/ from an earlier call while the machine was warm, when the
# working tree and both packs together pass the transfer limit)
[ -n "${X11_EXTRA:-}" ] && { cp -a "$X11_EXTRA"/. "$DSX"/ && say "X11 pack: $X11_EXTRA added"; }
say "GUI binary from commit $(cat "$DSG/bin/COMMIT" 2>/dev/null || echo unknown)"
FONT=/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf  # the first path the GUI's load_fonts tries
if [ ! -e "$FONT" ]; then
  { mkdir -p "$(dirname "$FONT")" && cp "$DSX/fonts/DejaVuSans.ttf" "$FONT" && say "font: copied to $FONT"; } ||
    say "font: could not copy to $FONT (the GUI uses ImGui's built-in font, without Greek)"
fi

# The NVIDIA GLX vendor library (libglvnd loads it by name when __GLX_VENDOR_LIBRARY_NAME=nvidia).
NVGLX=$(ldconfig -p 2>/dev/null | awk '/libGLX_nvidia\.so\.0 / {print $NF; exit}')
if [ -z "$NVGLX" ]; then
  NVGLX=$(ls /usr/local/nvidia/lib64/libGLX_nvidia.so* /usr/local/nvidia/lib/libGLX_nvidia.so* \
             /usr/lib/x86_64-linux-gnu/libGLX_nvidia.so* /usr/lib64/libGLX_nvidia.so* 2>/dev/null | head -1)
fi
NVDIR=""
if [ -n "$NVGLX" ]; then
  NVDIR=$(dirname "$NVGLX")
  if [ ! -e "$NVDIR/libGLX_nvidia.so.0" ]; then  # only the versioned file: give glvnd the name it opens
    mkdir -p "$DSX/nvlink" && ln -sf "$NVGLX" "$DSX/nvlink/libGLX_nvidia.so.0" && NVDIR="$DSX/nvlink:$NVDIR"
  fi
  say "NVIDIA GLX: $NVGLX"
else
  say "NVIDIA GLX: no libGLX_nvidia.so found (GL falls back to Mesa softpipe)"
fi
CUDALIB=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13", "lib") for p in nvidia.__path__))' 2>/dev/null); do
  [ -d "$d" ] && CUDALIB="$CUDALIB:$d"
done
XLIB="$DSX/lib"
GUILIB="$DSG/lib:$DSX/lib${NVDIR:+:$NVDIR}$CUDALIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if LD_LIBRARY_PATH="$GUILIB" ldd "$DSG/bin/diffscope" | grep -q "not found"; then
  say "diffscope misses libraries:"; LD_LIBRARY_PATH="$GUILIB" ldd "$DSG/bin/diffscope" | grep "not found" | tee -a "$SUMMARY"
fi

# --- Xvfb ----------------------------------------------------------------------------------------------------------
# GLX in Xvfb comes from Mesa's swrast DRI driver (server side, softpipe); clients then pick their GLX vendor.
MESA_ENV="LIBGL_DRIVERS_PATH=$DSX/dri GALLIUM_DRIVER=softpipe DRAW_USE_LLVM=0"
rm -f /tmp/.X11-unix/X99 /tmp/.X99-lock
env LD_LIBRARY_PATH="$XLIB" $MESA_ENV "$DSX/Xvfb" $DISP -screen 0 1920x1080x24 -nolisten tcp -noreset \
  -xkbdir "$DSX/xkb" > "$OUT/xvfb.log" 2>&1 &
XVFB_PID=$!
for _ in $(seq 50); do [ -S /tmp/.X11-unix/X99 ] && break; kill -0 $XVFB_PID 2>/dev/null || break; sleep 0.2; done
sleep 0.5
if kill -0 $XVFB_PID 2>/dev/null && [ -S /tmp/.X11-unix/X99 ]; then
  say "Xvfb: up on $DISP (pid $XVFB_PID)"
else
  say "Xvfb: FAILED to start"; cat "$OUT/xvfb.log" | tee -a "$LOG"; exit 1
fi

# GL: which vendor gives a window on this server. glxinfo -B runs with the same libraries as the GUI.
glx_try() {  # $1 = nvidia | mesa; prints the renderer line; status 0 when a context was made
  local extra=""
  [ "$1" = mesa ] && extra="$MESA_ENV"
  echo "### glxinfo -B with __GLX_VENDOR_LIBRARY_NAME=$1" >> "$LOG"
  env DISPLAY=$DISP LD_LIBRARY_PATH="$GUILIB" __GLX_VENDOR_LIBRARY_NAME=$1 $extra timeout 30 "$DSX/glxinfo" -B \
    > /tmp/ds_glxinfo_$1.txt 2>&1
  local rc=$?
  cat /tmp/ds_glxinfo_$1.txt >> "$LOG"
  grep -q "OpenGL renderer string" /tmp/ds_glxinfo_$1.txt && [ $rc = 0 ]
}
renderer() { grep -m1 "OpenGL renderer string" /tmp/ds_glxinfo_$1.txt | sed 's/.*: //'; }
core_version() { grep -m1 "core profile version string" /tmp/ds_glxinfo_$1.txt | sed 's/.*: //'; }
VENDOR=""
if [ "$GLMODE" != mesa ] && [ -n "$NVGLX" ] && glx_try nvidia && renderer nvidia | grep -qi nvidia; then
  VENDOR=nvidia
  say "GLX nvidia: renderer '$(renderer nvidia)', core '$(core_version nvidia)'"
else
  [ "$GLMODE" != mesa ] && [ -n "$NVGLX" ] && say "GLX nvidia: no NVIDIA context ($(grep -v '^name of display' /tmp/ds_glxinfo_nvidia.txt 2>/dev/null | grep -m2 -i -e error -e renderer | tr '\n' ' '))"
fi
if [ -z "$VENDOR" ] && [ "$GLMODE" != nvidia ]; then
  if glx_try mesa; then
    VENDOR=mesa
    say "GLX mesa: renderer '$(renderer mesa)', core '$(core_version mesa)' (software: frame times are Mesa's, not the GPU's)"
  else
    say "GLX mesa: no context"
  fi
fi
[ -n "$VENDOR" ] || { say "no GLX vendor gave a context: see gui.log"; VENDOR=${GLMODE/auto/nvidia}; }

# --- checkpoint and prompt -----------------------------------------------------------------------------------------
t0=$(date +%s)
if [ -f "$CKPT/model.safetensors" ] && [ -f "$CKPT/config.json" ]; then
  say "checkpoint: reusing $CKPT"
else
  python3 tools/make_random_checkpoint.py "$CKPT" ${SMALL:+--small} ${FAMILY:+--family $FAMILY} >> "$LOG" 2>&1 || { say "checkpoint: FAILED"; tail -5 "$LOG"; exit 1; }
  say "checkpoint: $(grep -m1 'B parameters' "$LOG"), made in $(( $(date +%s) - t0 )) s"
fi
python3 tools/make_needle_prompt.py "$PROMPT" --tokens "$TOKENS" --tokenizer "$CKPT" 2>&1 | tee -a "$LOG" | sed 's/^/prompt: /' | tee -a "$SUMMARY"
[ -s "$PROMPT" ] || { say "prompt: FAILED"; exit 1; }

# --- the GUI -------------------------------------------------------------------------------------------------------
SHOT=$OUT/gui_$TAG.png
CSV=$OUT/gui_replay_$TAG.csv
STATE=$OUT/gui_state_$TAG.json
run_gui() {  # $1 = vendor
  local extra=""
  [ "$1" = mesa ] && extra="$MESA_ENV"
  echo "### diffscope (GLX vendor $1)" >> "$LOG"
  rm -f "$SHOT" "$CSV" "$STATE"
  # While the GUI runs: the GL libraries its process mapped (which GLX vendor really drew), and an X-level picture
  # of the screen, the last of one every 3 s (xwd, converted below).
  rm -f /tmp/ds_gui_gl_libs.txt
  ( while sleep 3; do
      if [ ! -s /tmp/ds_gui_gl_libs.txt ]; then
        for p in /proc/[0-9]*; do
          [ "$(readlink "$p/exe" 2>/dev/null)" = "$DSG/bin/diffscope" ] || continue
          grep -o -E '/[^ ]*(libGLX_[a-z]+|libnvidia-gl[a-z]*|_dri)\.so[^ ]*' "$p/maps" 2>/dev/null | sort -u > /tmp/ds_gui_gl_libs.txt
        done
      fi
      env DISPLAY=$DISP LD_LIBRARY_PATH="$XLIB" "$DSX/xwd" -root -silent > /tmp/ds_root.xwd.part 2>/dev/null &&
        mv /tmp/ds_root.xwd.part /tmp/ds_root.xwd
    done ) &
  local shooter=$!
  local t=$(date +%s)
  env DISPLAY=$DISP LD_LIBRARY_PATH="$GUILIB" __GLX_VENDOR_LIBRARY_NAME=$1 $extra \
    timeout "$GUI_TIMEOUT" "$DSG/bin/diffscope" --backend "$BACKEND" --model "$CKPT" --prompt-file "$PROMPT" \
    ${HEAD:+--head $HEAD} ${SIZE:+--size $SIZE} ${MOUSE:+--mouse $MOUSE} --screenshot "$SHOT" --state-json "$STATE" \
    ${REPLAY:+--replay-lambda "$REPLAY" --replay-log "$CSV"} ${GUI_ARGS:-} \
    >> "$LOG" 2>&1
  GUI_RC=$?
  GUI_S=$(( $(date +%s) - t ))
  kill $shooter 2>/dev/null; wait $shooter 2>/dev/null
}
rm -f /tmp/ds_root.xwd
run_gui "$VENDOR"
say "diffscope: exit $GUI_RC after $GUI_S s (GLX vendor $VENDOR)$([ $GUI_RC = 124 ] && echo ', TIMED OUT')"
# A GUI that could not open its window on the NVIDIA GLX stops within seconds: then once more on Mesa.
if [ $GUI_RC != 0 ] && [ "$VENDOR" = nvidia ] && [ "$GLMODE" = auto ] && [ ! -s "$SHOT" ] && [ $GUI_S -lt 90 ]; then
  say "retrying with Mesa softpipe"
  VENDOR=mesa
  run_gui mesa
  say "diffscope: exit $GUI_RC after $GUI_S s (GLX vendor mesa)"
fi
grep "^diffscope" "$LOG" | tail -5 | sed 's/^/  /' | tee -a "$SUMMARY"
[ -s /tmp/ds_gui_gl_libs.txt ] && say "GL libraries in the GUI process: $(tr '\n' ' ' < /tmp/ds_gui_gl_libs.txt)"

# --- summary -------------------------------------------------------------------------------------------------------
python3 - "$SHOT" "$CSV" "$STATE" /tmp/ds_root.xwd "$OUT/xvfb_root_$TAG.png" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, os, statistics, struct, sys, zlib
shot, csv, state, xwd, root_png = sys.argv[1:6]
if os.path.exists(shot):
    with open(shot, "rb") as f:
        head = f.read(24)
    w, h = struct.unpack(">II", head[16:24])
    print(f"screenshot: {os.path.basename(shot)} {w}x{h}, {os.path.getsize(shot)} bytes")
else:
    print("screenshot: none")
if os.path.exists(state):
    s = json.load(open(state))
    hm = s.get("head_maps", {})
    tm = s.get("timings", {})
    print(f"state: {s.get('n_tokens')} tokens on {s.get('device', {}).get('backend')}, last forward "
          f"{tm.get('forward_ms', 0):.1f} ms (from layer {tm.get('first_layer')}); error shown: "
          f"{s.get('error_shown')} {s.get('error') or ''}; timed out: {s.get('timed_out')}; head view "
          f"{hm.get('layer')}.{hm.get('head')}, lambda {hm.get('lambda')}")
if os.path.exists(csv):
    rows = [r.split(",") for r in open(csv).read().split("\n")[1:] if r]
    fr = [float(r[2]) for r in rows if r[2] and float(r[2]) > 0]
    lat = [float(r[5]) for r in rows if r[5]]
    shown = len({r[4] for r in rows if r[4]})
    n_set = sum(1 for r in rows if r[3])
    if fr:
        print(f"replay: {len(rows)} frames ({n_set} setting a lambda), frame time median {statistics.median(fr):.1f} ms, max {max(fr):.1f} ms; "
              f"{shown} distinct lambdas shown; latency set->shown "
              + (f"median {statistics.median(lat):.1f} ms, max {max(lat):.1f} ms" if lat else "none"))
else:
    print("replay log: none")
# xwd (ZPixmap, 24/32 bpp) -> PNG, with no imaging library needed.
if os.path.exists(xwd):
    d = open(xwd, "rb").read()
    f = struct.unpack(">25I", d[:100])
    hsize, fmt, depth, W, H, bo, bpp, bpl, ncol = f[0], f[2], f[3], f[4], f[5], f[7], f[11], f[12], f[19]
    masks = f[14:17]
    off = hsize + 12 * ncol
    if fmt == 2 and bpp in (24, 32) and bpl >= W * bpp // 8:
        import numpy as np
        B = bpp // 8
        rows = np.frombuffer(d, np.uint8, count=H * bpl, offset=off).reshape(H, bpl)[:, :W * B].reshape(H, W, B)
        order = range(B) if bo == 0 else range(B - 1, -1, -1)  # byte k holds bits 8k.. (LSBFirst)
        px = sum(rows[..., i].astype(np.uint32) << np.uint32(8 * k) for k, i in enumerate(order))
        rgb = np.zeros((H, W, 3), np.uint8)
        for c, m in enumerate(masks):
            sh = (m & -m).bit_length() - 1
            rgb[..., c] = (px & m) >> sh
        raw = b"".join(b"\0" + rgb[y].tobytes() for y in range(H))
        chunk = lambda t, b: struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b))
        png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)) + \
            chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
        open(root_png, "wb").write(png)
        nonblack = float((rgb.max(axis=2) > 0).mean())
        print(f"Xvfb screen (xwd, last grab while the GUI ran): {os.path.basename(root_png)} {W}x{H}, "
              f"{100 * nonblack:.0f}% of pixels not black")
    else:
        print(f"xwd: format {fmt}, {bpp} bits a pixel, {bpl} bytes a line: not converted")
else:
    print("Xvfb screen: no xwd grab")
PY
say "total $(( $(date +%s) - t_start )) s"
kill $XVFB_PID 2>/dev/null
cat "$OUT/xvfb.log" >> "$LOG" 2>/dev/null && rm -f "$OUT/xvfb.log"
exit 0
