"""List the Vulkan physical devices as the Vulkan loader enumerates them; print them as JSON.

Run as its own process (``python -m llmgw_node.vulkan_devices [loader]``) by the node's probe:
loading a GPU driver into the daemon could crash or hang it, a child process can only fail.
The order is ``vkEnumeratePhysicalDevices``' order, the one ``GGML_VK_VISIBLE_DEVICES`` indexes.

Only core Vulkan 1.0 entry points the loader exports (``vkCreateInstance``,
``vkEnumeratePhysicalDevices``, ``vkGetPhysicalDeviceProperties``,
``vkGetPhysicalDeviceMemoryProperties``, ``vkDestroyInstance``), called through ctypes with the
structure layouts of the Vulkan 1.0 specification: nothing to build, no vulkan-tools needed.
"""

from __future__ import annotations

import ctypes
import json
import sys

# VkPhysicalDeviceType
DEVICE_TYPES = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}
_VK_STRUCTURE_TYPE_APPLICATION_INFO = 0
_VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO = 1
_VK_API_VERSION_1_0 = 1 << 22
_VK_MEMORY_HEAP_DEVICE_LOCAL_BIT = 1
# More devices than any host has: the answer is cut here rather than trusted.
MAX_DEVICES = 64
# VkPhysicalDeviceProperties is 824 bytes on x86-64 and arm64 (limits included); the buffer is
# larger so a layout we misjudge cannot write past it. deviceType is at byte 16, deviceName
# (char[256]) at byte 20.
_PROPERTIES_BYTES = 4096
# VkPhysicalDeviceMemoryProperties: memoryTypeCount (4), memoryTypes[32] (8 each), memoryHeapCount
# at 260, then memoryHeaps[16] at 264 (8-aligned), each {VkDeviceSize size; uint32 flags} = 16 bytes.
_MEMORY_BYTES = 1024


class _AppInfo(ctypes.Structure):
    _fields_ = [
        ("sType", ctypes.c_int32),
        ("pNext", ctypes.c_void_p),
        ("pApplicationName", ctypes.c_char_p),
        ("applicationVersion", ctypes.c_uint32),
        ("pEngineName", ctypes.c_char_p),
        ("engineVersion", ctypes.c_uint32),
        ("apiVersion", ctypes.c_uint32),
    ]


class _InstanceInfo(ctypes.Structure):
    _fields_ = [
        ("sType", ctypes.c_int32),
        ("pNext", ctypes.c_void_p),
        ("flags", ctypes.c_uint32),
        ("pApplicationInfo", ctypes.POINTER(_AppInfo)),
        ("enabledLayerCount", ctypes.c_uint32),
        ("ppEnabledLayerNames", ctypes.c_void_p),
        ("enabledExtensionCount", ctypes.c_uint32),
        ("ppEnabledExtensionNames", ctypes.c_void_p),
    ]


def enumerate_devices(loader: str = "libvulkan.so.1") -> list[dict[str, object]]:
    """Each device: index, name, type (``DEVICE_TYPES``), device-local memory in MiB."""
    vk = ctypes.CDLL(loader)
    app = _AppInfo(_VK_STRUCTURE_TYPE_APPLICATION_INFO, None, b"llmgw-node", 1, b"llmgw", 1, _VK_API_VERSION_1_0)
    info = _InstanceInfo(_VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, None, 0, ctypes.pointer(app), 0, None, 0, None)
    instance = ctypes.c_void_p()
    result = vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance))
    if result != 0:
        # VK_ERROR_INCOMPATIBLE_DRIVER (-9): the loader found no driver at all.
        raise RuntimeError(f"vkCreateInstance failed with VkResult {result}")
    try:
        count = ctypes.c_uint32(0)
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        n = min(count.value, MAX_DEVICES)
        handles = (ctypes.c_void_p * max(n, 1))()
        count.value = n
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        devices: list[dict[str, object]] = []
        for index in range(min(count.value, n)):
            props = ctypes.create_string_buffer(_PROPERTIES_BYTES)
            vk.vkGetPhysicalDeviceProperties(ctypes.c_void_p(handles[index]), props)
            kind = int.from_bytes(props.raw[16:20], "little")
            name = props.raw[20:276].split(b"\0", 1)[0].decode(errors="replace")
            memory = ctypes.create_string_buffer(_MEMORY_BYTES)
            vk.vkGetPhysicalDeviceMemoryProperties(ctypes.c_void_p(handles[index]), memory)
            heaps = min(int.from_bytes(memory.raw[260:264], "little"), 16)
            local = 0
            for h in range(heaps):
                at = 264 + 16 * h
                size = int.from_bytes(memory.raw[at : at + 8], "little")
                flags = int.from_bytes(memory.raw[at + 8 : at + 12], "little")
                if flags & _VK_MEMORY_HEAP_DEVICE_LOCAL_BIT:
                    local += size
            devices.append(
                {"index": index, "name": name[:200], "type": DEVICE_TYPES.get(kind, "other"), "memory_mib": local >> 20}
            )
        return devices
    finally:
        vk.vkDestroyInstance(instance, None)


def main(argv: list[str]) -> int:
    loader = argv[1] if len(argv) > 1 else "libvulkan.so.1"
    try:
        devices = enumerate_devices(loader)
    except OSError as exc:
        print(json.dumps({"error": f"no Vulkan loader: {exc}", "loader_missing": True}))
        return 0
    except (RuntimeError, AttributeError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 0
    print(json.dumps({"devices": devices}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
