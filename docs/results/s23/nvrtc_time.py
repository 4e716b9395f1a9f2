import ctypes, sys, time, glob, os
lib = ctypes.CDLL(glob.glob('/work/main/.cache/cuda/site/nvidia/cu13/lib/libnvrtc.so*')[0])
src = open(sys.argv[1],'rb').read()
def comp(opts):
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"k.cu", 0, None, None)==0
    arr = (ctypes.c_char_p*len(opts))(*[o.encode() for o in opts])
    t=time.time(); r=lib.nvrtcCompileProgram(prog, len(opts), arr); dt=time.time()-t
    n=ctypes.c_size_t(); lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n)); buf=ctypes.create_string_buffer(n.value); lib.nvrtcGetProgramLog(prog, buf)
    return r, dt, buf.value.decode()[-300:]
arch=sys.argv[2]
base=["-std=c++17","-lineinfo"]+sys.argv[3:]
for o in [["--gpu-architecture=compute_"+arch[3:]], ["--gpu-architecture="+arch], ["--gpu-architecture="+arch,"--ptxas-options=-v"]]:
    r,dt,log=comp(base+o); print(o, r, round(dt,3)); 
print(log)
