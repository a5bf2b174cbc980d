package kubernetes_test

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/api/apitesting"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
)

// Kubernetes' shared storage tests (k8s.io/apiserver/pkg/storage/testing)
// against etcd3.New on the client under test (-client), wired as
// k8s.io/apiserver's own pkg/storage/etcd3 store_test.go and
// watcher_test.go wire them, on 3-member test-bed clusters instead of one
// embedded member.
//
// TestStorage runs the tests that allow it on one shared cluster, each
// with a store of its own under a key prefix named after it (two keep
// upstream's root, see there); with
// -move-leader it hands leadership on every so often meanwhile. Its last
// subtest, Routing, judges by the members' own counts where the suite's
// writes and reads went. TestStorageCompaction gives each test that
// compacts a cluster of its own: a compaction is cluster-wide, and the
// shared tests read and watch from early revisions (RunWatchSemantics
// watches from resource version 1).
//
// Left out:
//   - RunOptionalTestProgressNotify: needs members that send watch progress
//     notifications every second (upstream sets the embedded server's
//     WatchProgressNotifyInterval); the test bed's members keep etcd's
//     10-minute default.
//   - RunTestOptionalWatchBookmarksWithCorrectResourceVersion: bookmarks
//     are the watch cache's (pkg/storage/cacher), which upstream's etcd3
//     tests do not run either; so are the cacher's own wirings of the suite.
//   - The RunBenchmark* functions: benchmarks, not checks.
//   - upstream's implementation tests of package etcd3 (TestLeaseMaxObjectCount,
//     TestListMetrics, TestGetListStream*, TestWatchChanSync*, TestPrefix*,
//     TestWatchErrorIncorrectConfiguration, TestGetCurrentResourceVersion …):
//     not shared tests; they read the store's unexported fields.
//
// RunTestDispatchBookmarkEvents runs with expectedWatchBookmarks false, as
// upstream: the etcd3 store sends none; the upstream members' 1 s progress
// notifications only make "none" a stronger claim.
func TestStorage(t *testing.T) {
	f := newFixture(t)
	tr := watchTraffic(t, f.c)
	for _, st := range sharedTests() {
		t.Run(st.name, func(t *testing.T) { st.run(t, f) })
	}
	t.Run("Routing", tr.check)
}

// onStore is a test entry for an upstream test that takes only a store.
func onStore(run func(context.Context, *testing.T, storage.Interface)) func(*testing.T, *fixture) {
	return func(t *testing.T, f *fixture) {
		ctx, s := f.setup(t)
		run(ctx, t, s)
	}
}

type storageTest struct {
	name string
	run  func(t *testing.T, f *fixture)
}

func sharedTests() []storageTest {
	return []storageTest{
		// store_test.go
		{"Create", func(t *testing.T, f *fixture) {
			ctx, s := f.setup(t)
			storagetesting.RunTestCreate(ctx, t, s, s.checkStorageInvariants)
		}},
		{"CreateWithTTL", onStore(storagetesting.RunTestCreateWithTTL)},
		{"CreateWithKeyExist", onStore(storagetesting.RunTestCreateWithKeyExist)},
		{"Get", onStore(storagetesting.RunTestGet)},
		{"UnconditionalDelete", onStore(storagetesting.RunTestUnconditionalDelete)},
		{"ConditionalDelete", onStore(storagetesting.RunTestConditionalDelete)},
		{"DeleteWithSuggestion", onStore(storagetesting.RunTestDeleteWithSuggestion)},
		{"DeleteWithSuggestionAndConflict", onStore(storagetesting.RunTestDeleteWithSuggestionAndConflict)},
		{"DeleteWithSuggestionOfDeletedObject", onStore(storagetesting.RunTestDeleteWithSuggestionOfDeletedObject)},
		{"ValidateDeletionWithSuggestion", onStore(storagetesting.RunTestValidateDeletionWithSuggestion)},
		{"ValidateDeletionWithOnlySuggestionValid", onStore(storagetesting.RunTestValidateDeletionWithOnlySuggestionValid)},
		{"DeleteWithConflict", onStore(storagetesting.RunTestDeleteWithConflict)},
		{"DeleteWithConflictAndMissingExpectedTransformOrDecodeError", func(t *testing.T, f *fixture) {
			gate(t, features.AllowUnsafeMalformedObjectDeletion, true)
			codec := &testCodec{Codec: apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)}
			ctx, s := f.setup(t, withCodec(codec))
			storagetesting.RunTestDeleteWithConflictAndMissingExpectedTransformOrDecodeError(ctx, t, s, codec.setFailing)
		}},
		{"DeleteWithConflictAndExpectedTransformError", func(t *testing.T, f *fixture) {
			gate(t, features.AllowUnsafeMalformedObjectDeletion, true)
			transformer := &testTransformer{Transformer: storagetesting.NewPrefixTransformer([]byte(valuePrefix), false)}
			ctx, s := f.setup(t, withTransformer(transformer))
			storagetesting.RunTestDeleteExpectedTransformOrDecodeError(ctx, t, s, transformer.setFailing)
		}},
		{"DeleteWithConflictAndExpectedDecodeError", func(t *testing.T, f *fixture) {
			gate(t, features.AllowUnsafeMalformedObjectDeletion, true)
			codec := &testCodec{Codec: apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)}
			ctx, s := f.setup(t, withCodec(codec))
			storagetesting.RunTestDeleteExpectedTransformOrDecodeError(ctx, t, s, codec.setFailing)
		}},
		{"DeleteWithSuggestionAndMissingExpectedTransformOrDecodeFailure", func(t *testing.T, f *fixture) {
			gate(t, features.AllowUnsafeMalformedObjectDeletion, true)
			ctx, s := f.setup(t)
			storagetesting.RunTestDeleteWithSuggestionAndMissingExpectedTransformOrDecodeError(ctx, t, s)
		}},
		{"PreconditionalDeleteWithSuggestion", onStore(storagetesting.RunTestPreconditionalDeleteWithSuggestion)},
		{"PreconditionalDeleteWithSuggestionPass", onStore(storagetesting.RunTestPreconditionalDeleteWithOnlySuggestionPass)},
		{"ListPaging", onStore(storagetesting.RunTestListPaging)},
		{"GetListNonRecursive", func(t *testing.T, f *fixture) {
			ctx, s := f.setup(t)
			storagetesting.RunTestGetListNonRecursive(ctx, t, s.increaseRV, s)
		}},
		{"GetListRecursivePrefix", onStore(storagetesting.RunTestGetListRecursivePrefix)},
		{"KeySchema", onStore(storagetesting.RunTestKeySchema)},
		// These two name the etcd key in their expected errors: upstream's
		// keys at the root. Nothing else on the cluster is there, and their
		// namespaces differ (ns-0 … and ns).
		{"GetListWithErrorAggregation", func(t *testing.T, f *fixture) {
			gate(t, features.AllowUnsafeMalformedObjectDeletion, true)
			ctx, s := f.setup(t, withUnsafeDelete(), withRootPrefix())
			storagetesting.RunTestGetListWithErrorAggregation(ctx, t, s, corruptObjectError())
		}},
		{"GetListWithoutErrorAggregation", func(t *testing.T, f *fixture) {
			gate(t, features.AllowUnsafeMalformedObjectDeletion, false)
			ctx, s := f.setup(t, withRootPrefix())
			storagetesting.RunTestGetListWithoutErrorAggregation(ctx, t, s, corruptObjectError())
		}},
		{"GuaranteedUpdate", func(t *testing.T, f *fixture) {
			ctx, s := f.setup(t)
			storagetesting.RunTestGuaranteedUpdate(ctx, t, s, s.checkStorageInvariants)
		}},
		{"GuaranteedUpdateWithTTL", onStore(storagetesting.RunTestGuaranteedUpdateWithTTL)},
		{"GuaranteedUpdateChecksStoredData", func(t *testing.T, f *fixture) {
			ctx, s := f.setup(t)
			storagetesting.RunTestGuaranteedUpdateChecksStoredData(ctx, t, s)
		}},
		{"GuaranteedUpdateWithConflict", onStore(storagetesting.RunTestGuaranteedUpdateWithConflict)},
		{"GuaranteedUpdateWithSuggestionAndConflict", onStore(storagetesting.RunTestGuaranteedUpdateWithSuggestionAndConflict)},
		{"TransformationFailure", func(t *testing.T, f *fixture) {
			ctx, s := f.setup(t)
			storagetesting.RunTestTransformationFailure(ctx, t, s)
		}},
		{"ConsistentList", func(t *testing.T, f *fixture) {
			for _, rangeStream := range []bool{false, true} {
				t.Run(fmt.Sprintf("rangeStream=%v", rangeStream), func(t *testing.T) {
					gate(t, features.EtcdRangeStream, rangeStream)
					resetFeatureSupportChecker(t)
					ctx, s := f.setup(t)
					storagetesting.RunTestConsistentList(ctx, t, s, s.increaseRV, false, true, false)
				})
			}
		}},
		{"ListContinuation", func(t *testing.T, f *fixture) {
			ctx, s := f.setup(t)
			storagetesting.RunTestListContinuation(ctx, t, s, s.checkStorageCalls(t))
		}},
		{"ListPaginationRareObject", func(t *testing.T, f *fixture) {
			// As upstream: the snapshot's compact-key read would be counted.
			gate(t, features.ListFromCacheSnapshot, false)
			ctx, s := f.setup(t)
			storagetesting.RunTestListPaginationRareObject(ctx, t, s, s.checkStorageCalls(t))
		}},
		{"ListContinuationWithFilter", func(t *testing.T, f *fixture) {
			ctx, s := f.setup(t)
			storagetesting.RunTestListContinuationWithFilter(ctx, t, s, s.checkStorageCalls(t))
		}},
		{"NamespaceScopedList", onStore(storagetesting.RunTestNamespaceScopedList)},
		{"ListResourceVersionMatch", func(t *testing.T, f *fixture) {
			ctx, s := f.setup(t)
			storagetesting.RunTestListResourceVersionMatch(ctx, t, s)
		}},
		{"Stats", func(t *testing.T, f *fixture) {
			for _, sizeBased := range []bool{true, false} {
				t.Run(fmt.Sprintf("SizeBasedListCostEstimate=%v", sizeBased), func(t *testing.T) {
					ctx, s := f.setup(t)
					if sizeBased {
						if err := s.EnableResourceSizeEstimation(s.keys); err != nil {
							t.Fatal(err)
						}
					}
					storagetesting.RunTestStats(ctx, t, s, s.codec, s.swap, sizeBased)
				})
			}
		}},

		// watcher_test.go, TestWatch's subtests
		{"Watch", onStore(storagetesting.RunTestWatch)},
		{"ClusterScopedWatch", onStore(storagetesting.RunTestClusterScopedWatch)},
		{"NamespaceScopedWatch", onStore(storagetesting.RunTestNamespaceScopedWatch)},
		{"DeleteTriggerWatch", onStore(storagetesting.RunTestDeleteTriggerWatch)},
		{"WatchFromNonZero", onStore(storagetesting.RunTestWatchFromNonZero)},
		{"DelayedWatchDelivery", onStore(storagetesting.RunTestDelayedWatchDelivery)},
		{"WatchError", func(t *testing.T, f *fixture) {
			ctx, s := f.setup(t)
			storagetesting.RunTestWatchError(ctx, t, s)
		}},
		{"WatchContextCancel", onStore(storagetesting.RunTestWatchContextCancel)},
		{"WatcherTimeout", onStore(storagetesting.RunTestWatcherTimeout)},
		{"WatchDeleteEventObjectHaveLatestRV", onStore(storagetesting.RunTestWatchDeleteEventObjectHaveLatestRV)},
		{"WatchInitializationSignal", onStore(storagetesting.RunTestWatchInitializationSignal)},
		{"WatchWithUnsafeDelete", func(t *testing.T, f *fixture) {
			gate(t, features.AllowUnsafeMalformedObjectDeletion, true)
			ctx, s := f.setup(t)
			storagetesting.RunTestWatchWithUnsafeDelete(ctx, t, s, corruptObjectError())
		}},
		{"WatchDispatchBookmarkEvents", func(t *testing.T, f *fixture) {
			ctx, s := f.setup(t)
			storagetesting.RunTestWatchDispatchBookmarkEvents(ctx, t, s, false)
		}},
		{"SendInitialEventsBackwardCompatibility", func(t *testing.T, f *fixture) {
			ctx, s := f.setup(t)
			storagetesting.RunSendInitialEventsBackwardCompatibility(ctx, t, s)
		}},
		{"WatchSemantics", func(t *testing.T, f *fixture) {
			for _, rangeStream := range []bool{false, true} {
				t.Run(fmt.Sprintf("RangeStream=%v", rangeStream), func(t *testing.T) {
					gate(t, features.EtcdRangeStream, rangeStream)
					t.Run("WatchSemantics", func(t *testing.T) {
						ctx, s := f.setup(t)
						storagetesting.RunWatchSemantics(ctx, t, s)
					})
					t.Run("WatchSemanticsWithConcurrentDecode", func(t *testing.T) {
						gate(t, features.ConcurrentWatchObjectDecode, true)
						ctx, s := f.setup(t)
						storagetesting.RunWatchSemantics(ctx, t, s)
					})
					t.Run("WatchSemanticInitialEventsExtended", func(t *testing.T) {
						ctx, s := f.setup(t)
						storagetesting.RunWatchSemanticInitialEventsExtended(ctx, t, s)
					})
					t.Run("WatchListMatchSingle", func(t *testing.T) {
						ctx, s := f.setup(t)
						storagetesting.RunWatchListMatchSingle(ctx, t, s)
					})
				})
			}
		}},
		{"WatchErrorEventIsBlockingFurtherEvent", func(t *testing.T, f *fixture) {
			ctx, s := f.setup(t)
			storagetesting.RunWatchErrorIsBlockingFurtherEvents(ctx, t, s)
		}},
	}
}

// TestStorageCompaction runs the shared tests that compact, each on a
// cluster of its own (see TestStorage). The leader stays put here.
func TestStorageCompaction(t *testing.T) {
	for _, rangeStream := range []bool{false, true} {
		t.Run(fmt.Sprintf("List/rangeStream=%v", rangeStream), func(t *testing.T) {
			gate(t, features.EtcdRangeStream, rangeStream)
			resetFeatureSupportChecker(t)
			ctx, s := newFixture(t).setup(t)
			storagetesting.RunTestList(ctx, t, s, s.compact, false, s.lists)
			// As upstream: lists go as RangeStream exactly when the gate says.
			streamReads := s.kv.GetStreamReadsAndReset()
			if rangeStream && streamReads == 0 {
				t.Error("expected lists to be served by RangeStream")
			}
			if !rangeStream && streamReads > 0 {
				t.Errorf("expected no RangeStream requests with the feature disabled, got %d", streamReads)
			}
		})
	}
	t.Run("WatchFromZero", func(t *testing.T) {
		ctx, s := newFixture(t).setup(t)
		storagetesting.RunTestWatchFromZero(ctx, t, s, s.compact)
	})
	t.Run("ListInconsistentContinuation", func(t *testing.T) {
		ctx, s := newFixture(t).setup(t)
		storagetesting.RunTestListInconsistentContinuation(ctx, t, s, s.compact)
	})
	t.Run("CompactRevision", func(t *testing.T) {
		// As upstream: the store learns of others' compactions by watching
		// compact_rev_key, which ListFromCacheSnapshot turns on.
		gate(t, features.ListFromCacheSnapshot, true)
		ctx, s := newFixture(t).setup(t)
		storagetesting.RunTestCompactRevision(ctx, t, s, s.increaseRV, s.compact)
	})
}

func gate(t *testing.T, f featuregate.Feature, on bool) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, f, on)
}
