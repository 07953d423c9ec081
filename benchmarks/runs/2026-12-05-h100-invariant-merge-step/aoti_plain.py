"""Does an AOTInductor package of a plain Python custom op (not mla_dcp's) load on this torch?"""
import faulthandler, tempfile, torch
faulthandler.enable()
@torch.library.custom_op("probe_aoti::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2
@twice.register_fake
def _(x):
    return torch.empty_like(x)
class M(torch.nn.Module):
    def forward(self, x):
        return twice(x) + 1
x = torch.randn(8, device="cuda")
ep = torch.export.export(M(), (x,))
path = torch._inductor.aoti_compile_and_package(ep, package_path=tempfile.mkdtemp() + "/p.pt2")
print("packaged", flush=True)
r = torch._inductor.aoti_load_package(path)
print("loaded", flush=True)
print("equal", torch.equal(r(x), M()(x)), torch.__version__, flush=True)
