-- Specs of cuptimon.demangle and cuptimon.kernel_name: the kernel names tables show.
-- luacheck: std +busted
local cm = require "cuptimon"

describe("cuptimon.demangle", function()
  it("demangles an Itanium C++ symbol", function()
    assert.are.equal("void cm_demo_matmul<16>(float const*, float const*, float*, int, int, int, "
      .. "bool, bool, float)", cm.demangle("_Z14cm_demo_matmulILi16EEvPKfS1_Pfiiibbf"))
  end)
  it("returns names that are not mangled, or do not demangle, unchanged", function()
    assert.are.equal("vectorAdd", cm.demangle("vectorAdd"))
    assert.are.equal("_Zgarbage!", cm.demangle("_Zgarbage!"))
    assert.are.equal("", cm.demangle(""))
  end)
  it("raises on a non-string argument, naming the function", function()
    local ok, err = pcall(cm.demangle, 42)
    assert.is_false(ok)
    assert.matches("cuptimon.demangle: expected a string, got number", err)
  end)
end)

describe("cuptimon.kernel_name", function()
  it("drops the parameter list and the return type, keeping template arguments", function()
    assert.are.equal("cm_demo_matmul<16>", cm.kernel_name("_Z14cm_demo_matmulILi16EEvPKfS1_Pfiiibbf"))
    assert.are.equal("at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
      .. "at::detail::Array<char*, 1> >", cm.kernel_name("_ZN2at6native29vectorized_elementwise_"
      .. "kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_"))
    assert.are.equal("reduceSum", cm.kernel_name("_Z9reduceSumPKfPfi"))
  end)
  it("keeps the whole signature with full = true", function()
    assert.are.equal("reduceSum(float const*, float*, int)", cm.kernel_name("_Z9reduceSumPKfPfi", true))
  end)
  it("returns extern \"C\" names unchanged", function()
    assert.are.equal("cm_demo_bias_relu", cm.kernel_name("cm_demo_bias_relu"))
  end)
end)
