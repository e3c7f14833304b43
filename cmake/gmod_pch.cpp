// The translation unit that owns cmake/gmod_pch.h's precompiled form (cmake/Precompiled.cmake); it defines nothing.
