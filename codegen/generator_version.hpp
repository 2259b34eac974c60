#pragma once
// Bumped whenever a generator changes what it emits in a way the rendered source
// would not show (it is part of every cache key).
#define KDTREE_GENERATOR_VERSION "1"
